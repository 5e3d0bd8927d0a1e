"""pipeline-health: alarms over every pipeline's records (checks) and their incidents (one notification each)."""
