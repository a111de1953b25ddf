"""npa-airflow: run GPU training on Slurm (over SSH) and on burst clusters (SkyPilot API server).

Importing this package is cheap on purpose: DAG files import operators at parse time, so nothing here
pulls in asyncssh, SkyPilot or HTTP clients.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _field(
    label: str, description: str | None = None, kind: str = "string", nullable: bool = True, **schema: object
) -> dict:
    """One connection-form field: a label, an optional help text and its JSON schema."""
    field: dict[str, object] = {"label": label}
    if description:
        field["description"] = description
    field["schema"] = {"type": [kind, "null"] if nullable else kind, **schema}
    return field


_SLURM_FIELDS = {
    "private_key": _field(
        "Private key",
        "PEM/OpenSSH private key text (the password field holds its passphrase, if any).",
        format="password",
    ),
    "key_file": _field("Private key file", "Path to a private key file on the Airflow worker/triggerer."),
    "known_hosts": _field(
        "known_hosts",
        "Path to a known_hosts file, or its content. Host keys are verified against it.",
        format="multiline",
    ),
    "host_key": _field(
        "Host key", "One public host key line (e.g. 'ssh-ed25519 AAAA...') trusted for every login host."
    ),
    "insecure_skip_host_key_check": _field(
        "Skip host key verification (insecure)",
        "Accept any host key. Logged as a warning on every connection.",
        kind="boolean",
        nullable=False,
        default=False,
    ),
    "partition": _field("Default GPU partition", "Partition for training jobs when a task does not name one."),
    "account": _field("Account", "Slurm account for #SBATCH --account (when the site requires one)."),
    "results_root": _field(
        "Results root (shared storage)",
        "Absolute path on shared storage (e.g. Lustre) under which job directories are created.",
    ),
    "cpu_partition": _field(
        "CPU partition for image conversion", "Partition where images are converted to .sqsh (never a GPU partition)."
    ),
    "sqsh_cache_dir": _field(
        ".sqsh cache directory", "Absolute shared path where converted .sqsh images are cached by name."
    ),
    "cluster_name": _field(
        "Slurm cluster name (-M)", "Only for multi-cluster sites: passed as -M to every Slurm command."
    ),
    "connect_timeout": _field("Connect timeout (s)", kind="number", default=15),
    "job_url_template": _field(
        "Job page URL template", "Site page for a job, e.g. https://ood.example/pun/sys/activejobs?jobid={job_id}"
    ),
}

_SKYPILOT_FIELDS = {
    "user": _field("User name", "The user requests are made as on the API server (default: airflow)."),
    "token": _field("Service-account token", "Bearer token for the SkyPilot API server (optional).", format="password"),
    "config_overrides": _field(
        "Client config overrides", "JSON object merged into the request's config override (optional).", kind="object"
    ),
    "dashboard_url_template": _field("Dashboard URL template", "e.g. {endpoint}/dashboard/clusters/{cluster}"),
}


def _modules(slurm: list[str], skypilot: list[str]) -> list[dict[str, object]]:
    return [
        {"integration-name": "Slurm", "python-modules": slurm},
        {"integration-name": "SkyPilot", "python-modules": skypilot},
    ]


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
        "hooks": _modules(["npa_airflow.slurm.hook"], ["npa_airflow.burst.hook"]),
        "operators": _modules(["npa_airflow.slurm.operators"], ["npa_airflow.burst.operators"]),
        "sensors": _modules(["npa_airflow.slurm.sensors"], ["npa_airflow.burst.sensors"]),
        "triggers": _modules(
            ["npa_airflow.slurm.triggers", "npa_airflow.slurm.convert_trigger"], ["npa_airflow.burst.triggers"]
        ),
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
                    "placeholders": {"host": "http://127.0.0.1:26580"},
                },
                "conn-fields": _SKYPILOT_FIELDS,
            },
        ],
        "extra-links": [
            "npa_airflow.common.links.SlurmJobLink",
            "npa_airflow.common.links.BurstJobLink",
        ],
    }
