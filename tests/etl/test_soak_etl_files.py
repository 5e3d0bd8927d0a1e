"""The soak's ETL files at the seed's sizes (issue 40 item 2): sizes drawn from MB ± spread inside the sizes the
stack accepts, whole NDJSON lines, each file's line count exact (the soak's row check counts them), the same draw
every run."""

from __future__ import annotations

import json

from benchmarks.soak import EtlFiles

MIB = 2**20


def test_files_of_the_seeds_spread_stay_inside_the_accepted_sizes_and_count_their_lines_exactly():
    bounds = (0.5 * MIB, 3.5 * MIB)  # narrower than 2 MB ± 99%: the stack's own bounds win
    files = EtlFiles(0, mb=2, spread=0.99, bounds=bounds)
    made = [files.make(n) for n in range(16)]
    again = EtlFiles(0, mb=2, spread=0.99, bounds=bounds)
    assert [again.make(n) for n in range(16)] == made  # a seeded draw: every run feeds the same files
    for data, lines in made:
        assert bounds[0] <= len(data) <= bounds[1]
        assert data.endswith(b"\n") and data.count(b"\n") == lines
        assert all(json.loads(line)["user"] for line in data[:2000].splitlines()[:5] + data[-2000:].splitlines()[-5:])
    sizes = [len(data) for data, _ in made]
    assert max(sizes) - min(sizes) > 2 * MIB  # spread over the range, not one size
    assert len({data[:200] for data, _ in made}) > 1  # files start from different blocks


def test_without_a_size_every_file_has_the_given_lines():
    data, lines = EtlFiles(50).make(3)
    assert lines == 50 and data.count(b"\n") == 50
