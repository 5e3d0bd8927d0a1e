"""Data arrival: event sources (a file-system watch locally, S3 notifications through SQS in AWS) and the
listeners that hand what arrives to each pipeline."""
