"""What a Slurm job is before it runs (pure): the spec and its fields, the rendered script, staging, the layout of a
job's files, the fit checks, the owners of jobs found by name, and the builders of the preflight, probe and
conversion jobs."""
