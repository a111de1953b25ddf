"""npa-airflow: run GPU training on Slurm (over SSH) and on burst clusters (SkyPilot API server).

Importing this package is cheap on purpose: DAG files import operators at parse time, so nothing here
pulls in asyncssh, SkyPilot or HTTP clients.
"""

from __future__ import annotations

__version__ = "0.1.0"

_SLURM_FIELDS = {
    "private_key": {
        "label": "Private key",
        "description": "PEM/OpenSSH private key text (the password field holds its passphrase, if any).",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "key_file": {
        "label": "Private key file",
        "description": "Path to a private key file on the Airflow worker/triggerer.",
        "schema": {"type": ["string", "null"]},
    },
    "known_hosts": {
        "label": "known_hosts",
        "description": "Path to a known_hosts file, or its content. Host keys are verified against it.",
        "schema": {"type": ["string", "null"], "format": "multiline"},
    },
    "host_key": {
        "label": "Host key",
        "description": "One public host key line (e.g. 'ssh-ed25519 AAAA...') trusted for every login host.",
        "schema": {"type": ["string", "null"]},
    },
    "insecure_skip_host_key_check": {
        "label": "Skip host key verification (insecure)",
        "description": "Accept any host key. Logged as a warning on every connection.",
        "schema": {"type": "boolean", "default": False},
    },
    "partition": {
        "label": "Default GPU partition",
        "description": "Partition for training jobs when a task does not name one.",
        "schema": {"type": ["string", "null"]},
    },
    "account": {
        "label": "Account",
        "description": "Slurm account for #SBATCH --account (when the site requires one).",
        "schema": {"type": ["string", "null"]},
    },
    "results_root": {
        "label": "Results root (shared storage)",
        "description": "Absolute path on shared storage (e.g. Lustre) under which job directories are created.",
        "schema": {"type": ["string", "null"]},
    },
    "cpu_partition": {
        "label": "CPU partition for image conversion",
        "description": "Partition where images are converted to .sqsh (never a GPU partition).",
        "schema": {"type": ["string", "null"]},
    },
    "sqsh_cache_dir": {
        "label": ".sqsh cache directory",
        "description": "Absolute shared path where converted .sqsh images are cached by name.",
        "schema": {"type": ["string", "null"]},
    },
    "cluster_name": {
        "label": "Slurm cluster name (-M)",
        "description": "Only for multi-cluster sites: passed as -M to every Slurm command.",
        "schema": {"type": ["string", "null"]},
    },
    "connect_timeout": {
        "label": "Connect timeout (s)",
        "schema": {"type": ["number", "null"], "default": 15},
    },
    "job_url_template": {
        "label": "Job page URL template",
        "description": "Site page for a job, e.g. https://ood.example/pun/sys/activejobs?jobid={job_id}",
        "schema": {"type": ["string", "null"]},
    },
}

_SKYPILOT_FIELDS = {
    "user": {
        "label": "User name",
        "description": "The user requests are made as on the API server (default: airflow).",
        "schema": {"type": ["string", "null"]},
    },
    "token": {
        "label": "Service-account token",
        "description": "Bearer token for the SkyPilot API server (optional).",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "config_overrides": {
        "label": "Client config overrides",
        "description": "JSON object merged into the request's config override (optional).",
        "schema": {"type": ["object", "null"]},
    },
    "dashboard_url_template": {
        "label": "Dashboard URL template",
        "description": "e.g. {endpoint}/dashboard/clusters/{cluster}",
        "schema": {"type": ["string", "null"]},
    },
}


def get_provider_info() -> dict:
    return {
        "package-name": "npa-airflow",
        "name": "NPA GPU training (Slurm, SkyPilot)",
        "description": "Run multi-node GPU training on Slurm over SSH and on SkyPilot burst clusters.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "Slurm", "external-doc-url": "https://slurm.schedmd.com/", "tags": ["software"]},
            {"integration-name": "SkyPilot", "external-doc-url": "https://docs.skypilot.co/", "tags": ["software"]},
        ],
        "hooks": [
            {"integration-name": "Slurm", "python-modules": ["npa_airflow.slurm.hook"]},
            {"integration-name": "SkyPilot", "python-modules": ["npa_airflow.burst.hook"]},
        ],
        "operators": [
            {
                "integration-name": "Slurm",
                "python-modules": ["npa_airflow.slurm.operators"],
            },
            {"integration-name": "SkyPilot", "python-modules": ["npa_airflow.burst.operators"]},
        ],
        "sensors": [
            {"integration-name": "Slurm", "python-modules": ["npa_airflow.slurm.sensors"]},
            {"integration-name": "SkyPilot", "python-modules": ["npa_airflow.burst.sensors"]},
        ],
        "triggers": [
            {
                "integration-name": "Slurm",
                "python-modules": ["npa_airflow.slurm.triggers", "npa_airflow.slurm.convert_trigger"],
            },
            {"integration-name": "SkyPilot", "python-modules": ["npa_airflow.burst.triggers"]},
        ],
        "connection-types": [
            {
                "connection-type": "slurm",
                "hook-class-name": "npa_airflow.slurm.hook.SlurmHook",
                "hook-name": "Slurm (SSH login host)",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "extra"],
                    "relabeling": {
                        "host": "Login host(s), comma-separated for failover",
                        "login": "Cluster user",
                        "password": "Key passphrase",
                    },
                    "placeholders": {"host": "login1.example.org,login2.example.org", "port": "22"},
                },
                "conn-fields": _SLURM_FIELDS,
            },
            {
                "connection-type": "skypilot",
                "hook-class-name": "npa_airflow.burst.hook.SkyPilotHook",
                "hook-name": "SkyPilot API server",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "password", "port", "extra"],
                    "relabeling": {"host": "API server endpoint"},
                    "placeholders": {"host": "http://127.0.0.1:46580"},
                },
                "conn-fields": _SKYPILOT_FIELDS,
            },
        ],
        "extra-links": [
            "npa_airflow.common.links.SlurmJobLink",
            "npa_airflow.common.links.BurstJobLink",
        ],
    }
