"""The Compute page: every Slurm and Burst job of this deployment's live task instances, in the Airflow UI.

rows (pure: rows, totals, filters) <- sources (database, one cached state query per cluster) <- app (HTTP);
mount is what the plugin (npa_airflow/plugin.py) registers.
"""
