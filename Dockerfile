# The pipelines image the ECS deployments run (prefect.yaml's ecs set builds and pushes it: `prefect deploy --name ecs`).
# The build stage installs exactly what `make install` installs, without the dev extra: `pip install -c constraints.txt .`;
# ffmpeg is the static binary of the pinned imageio-ffmpeg wheel, as locally (no distribution ffmpeg).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /opt/prefect/pipelines
COPY pyproject.toml constraints.txt README.md ./
COPY blocks/ blocks/
COPY deployments/ deployments/
COPY flows/ flows/
COPY infra/ infra/
COPY tasks/ tasks/
RUN pip install --no-cache-dir -c constraints.txt .
# the image is refused at build time when a flow does not import or the wheel's ffmpeg does not run here
RUN python -c "import importlib, pathlib; [importlib.import_module(f'flows.{p.stem}') for p in pathlib.Path('flows').glob('[!_]*.py')]" \
 && python -c "import subprocess, imageio_ffmpeg; subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), '-version'], check=True)"

FROM ${PYTHON_IMAGE} AS runtime
# the release this image is (tasks/core/release.py's VERSION; tests/core/test_releases.py checks they agree)
LABEL org.opencontainers.image.title="prefect-pipelines" \
      org.opencontainers.image.version="0.3.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# the containers' one writable folder (HOME, PREFECT_HOME, a listener's heartbeat: the task definitions' "scratch"
# bind mount; the root file system is read-only): ECS creates a bind mount root's with mode 0755 unless the image
# declares its path a VOLUME, whose ownership it then copies in, so the image owns it to the user and declares it
RUN groupadd --system --gid 10001 pipelines \
 && useradd --system --uid 10001 --gid pipelines --create-home --home-dir /home/pipelines pipelines \
 && install -d -o 10001 -g 10001 -m 0700 /tmp
VOLUME ["/tmp"]
COPY --from=build /opt/venv /opt/venv
# prefect.yaml's ecs pull step runs flows from here (set_working_directory: /opt/prefect/pipelines)
WORKDIR /opt/prefect/pipelines
COPY --from=build /opt/prefect/pipelines /opt/prefect/pipelines
COPY prefect.yaml ./
USER 10001:10001
CMD ["prefect", "worker", "start", "--pool", "aws-ecs", "--type", "ecs"]
