"""The video pipeline's own parts of the AWS stack (``Pipeline.aws``): your SageMaker async endpoints, which its
sagemaker backend invokes (``tasks/video/inference.py``)."""

from __future__ import annotations

from tasks.core.aws_template import PREFIX_ARN, AwsParts, sub, when

ENDPOINTS = {
    "Type": "String",
    "Default": "",
    "AllowedPattern": "[a-z0-9-]{0,63}",
    "Description": "Name prefix of your SageMaker async endpoints (VideoInference.endpoint_name, the video "
    "pipeline's sagemaker backend); empty: the task role may invoke none",
}

# the endpoints' outputs are read from the S3 output path you give them (docs/aws.md: under the store's prefix)
PARTS = AwsParts(
    parameters={"VideoEndpointPrefix": ENDPOINTS},
    conditions={"HasVideoEndpoints": "VideoEndpointPrefix"},
    statements=[
        when(
            "HasVideoEndpoints",
            {
                "Sid": "InvokeVideoEndpoints",
                "Effect": "Allow",
                "Action": "sagemaker:InvokeEndpointAsync",
                "Resource": sub(f"{PREFIX_ARN.format(service='sagemaker')}:endpoint/${{VideoEndpointPrefix}}*"),
            },
        )
    ],
)
