"""Local stack, work pools and deployment helpers."""
