"""The ETL's own parts of the AWS stack (``Pipeline.aws``): the Glue catalog its merge registers partitions in
(``tasks/etl/catalog.py``), and how long the objects that explain its records are kept."""

from __future__ import annotations

from blocks.etl import EtlSettings
from tasks.core.aws_template import AwsParts, sub

CATALOG_DATABASE = {
    "Type": "String",
    "Default": EtlSettings.model_fields["catalog_database"].default,
    "AllowedPattern": "[a-z0-9_]+",
    "Description": "Glue database the ETL merge registers its Parquet partitions in (ETL_CATALOG_DATABASE)",
}
GLUE = "arn:${AWS::Partition}:glue:${AWS::Region}:${AWS::AccountId}"
# Glue authorizes a call on the catalog, the database and the table together
CATALOG = {
    "Sid": "Catalog",
    "Effect": "Allow",
    "Action": [
        "glue:GetDatabase",
        "glue:CreateDatabase",
        "glue:GetTable",
        "glue:CreateTable",
        "glue:UpdateTable",
        "glue:GetPartition",
        "glue:CreatePartition",
        "glue:UpdatePartition",
    ],
    "Resource": [
        sub(f"{GLUE}:catalog"),
        sub(f"{GLUE}:database/${{CatalogDatabase}}"),
        sub(f"{GLUE}:table/${{CatalogDatabase}}/*"),
    ],
}
# what explains a record (keys.quarantine_key, keys.manifest_key, keys.run_report_key) is kept as long as the record
EXPLAINING = {"quarantine": "quarantine/", "manifests": "manifests/", "reports": "logs/"}

PARTS = AwsParts(
    parameters={"CatalogDatabase": CATALOG_DATABASE},
    statements=[CATALOG],
    expiring=EXPLAINING,
    expiring_days=EtlSettings.model_fields["ttl_days"].default,  # seed 001: records expire 30 days after they end
    environment={EtlSettings.env_name("catalog_database"): "CatalogDatabase"},
)
