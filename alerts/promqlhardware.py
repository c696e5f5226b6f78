"""The PromQL of the node's hardware rules (``alerts.hardwarecatalogue``): GPUs and InfiniBand ports missing, ports
slow, fatal NVSwitch SXids, the NVLink fabric not ready, settings apart from the cluster's majority.

Split from ``alerts.promql`` (whose conventions and helpers it uses) so each stays one readable module; each function
takes the rule and returns what ``gpulens rules export`` writes for it.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Exported
from gpulens.alerts.promql import GPU, ON_PORT, PORT_GPUS, port_rule
from gpulens.nodehardware import IB_RATE_TOLERANCE
from gpulens.xidcatalogue import SXIDS

_IB_UP: Final = f'{ON_PORT} gpulens_nic_info{{link_layer="InfiniBand"}} and {ON_PORT} gpulens_nic_up == 1'


def gpu_missing(rule: AlertRule) -> list[Exported]:
    """A GPU on the bus that the driver does not open (by address), or fewer GPUs than expected: one rule, the two
    kept apart by their labels (``pci_bus_id`` or none)."""
    expr = (
        "(gpulens_node_gpu_missing == 1) or ((gpulens_node_pci_gpus or gpulens_node_nvml_gpus) "
        "< on(node) group_left() gpulens_node_gpus_expected)"
    )
    summary = (
        "GpuMissing: {{ $labels.node }} {{ with $labels.pci_bus_id }}GPU {{ . }} is on the PCI bus but the driver "
        "does not open it{{ else }}has {{ $value }} GPUs, fewer than expected{{ end }}."
    )
    return [Exported(expr, rule.for_s, summary)]


def ib_port_missing(rule: AlertRule) -> list[Exported]:
    summary = "IbPortMissing: {{ $labels.node }} has {{ $value }} InfiniBand ports up, fewer than expected."
    return [
        Exported(
            "gpulens_node_ib_ports_active < on(node) group_left() gpulens_node_ib_ports_expected", rule.for_s, summary
        )
    ]


def ib_port_slow(rule: AlertRule) -> list[Exported]:
    rate = f"(gpulens_nic_link_speed_bytes_per_second and {_IB_UP})"
    expected = f"({IB_RATE_TOLERANCE:g} * gpulens_node_ib_rate_expected_bytes_per_second)"
    return port_rule(rule, f"({rate} < on(node) group_left() {expected}) {PORT_GPUS}")


def nvswitch_fatal_sxid(rule: AlertRule) -> list[Exported]:
    """A switch's fatal SXids since the agent started; the summary names each catalogued code and its action."""
    expr = 'max by (node, pci_bus_id, sxid) (gpulens_nvswitch_sxid_errors_total{severity="fatal"}) > 0'
    named = "".join(
        f'{{{{ if eq $labels.sxid "{s.code}" }}}} ({s.name}; action: {s.action}){{{{ end }}}}'
        for s in SXIDS
        if s.severity == "fatal"
    )
    where = "{{ $labels.node }}: NVSwitch {{ $labels.pci_bus_id }} reported SXid {{ $labels.sxid }}"
    summary = f"NvswitchFatalSxid on {where}{named}."
    return [Exported(expr, rule.for_s, summary)]


def gpu_fabric_not_ready(rule: AlertRule) -> list[Exported]:
    """A GPU not registered with the fabric, or the node's fabric manager down (labelled ``service``)."""
    expr = (
        "(gpulens_gpu_fabric_ready == 0) or "
        'label_replace(gpulens_node_fabric_manager_up == 0, "service", "nv-fabricmanager", "", "")'
    )
    summary = (
        "GpuFabricNotReady: {{ with $labels.service }}{{ . }} is not running on {{ $labels.node }}{{ else }}"
        "GPU {{ $labels.node }}:{{ $labels.gpu }} is not registered with the NVLink fabric{{ end }}."
    )
    return [Exported(expr, rule.for_s, summary)]


def _minority(values: str, label: str, min_peers: float, peers: str = "") -> str:
    """The series of ``values`` (one per node or GPU, the setting in ``label``) whose value is not the one more than
    half of their peers hold (the same ``peers`` label: a GPU model), when there are at least ``min_peers`` of them."""
    if not peers:
        total = f"scalar(count({values}))"
        return (
            f"({values}) and on({label}) (count by ({label}) ({values}) * 2 <= {total}) "
            f"and on() (max(count by ({label}) ({values})) * 2 > {total}) and on() (count({values}) >= {min_peers:g})"
        )
    by = f"{peers}, {label}"
    total = f"count by ({peers}) ({values})"
    top = f"max by ({peers}) (count by ({by}) ({values}))"
    return (
        f"({values}) and on({by}) (count by ({by}) ({values}) * 2 <= on({peers}) group_left() {total}) "
        f"and on({peers}) ({top} * 2 > {total}) and on({peers}) ({total} >= {min_peers:g})"
    )


def gpu_config_drift(rule: AlertRule) -> list[Exported]:
    """One rule per setting; ``count_values`` turns a 0/1 setting into a label the majority can be counted by. A GPU
    setting's peers are the GPUs of its model."""
    peers = rule.threshold("min_peers")
    settings = (
        ("driver_version", "max by (node, driver_version) (gpulens_gpu_info)", "driver_version"),
        ("nvidia_peermem", 'count_values by (node) ("value", gpulens_node_peermem_loaded)', "value"),
        ("persistence_mode", f'count_values by ({GPU}) ("value", gpulens_gpu_persistence_mode)', "value"),
        ("ecc_mode", f'count_values by ({GPU}) ("value", gpulens_gpu_ecc_enabled)', "value"),
    )
    return [
        Exported(
            _minority(values, label, peers, "model" if setting in ("persistence_mode", "ecc_mode") else ""),
            rule.for_s,
            f"GpuConfigDrift: {{{{ $labels.node }}}} runs {setting} {{{{ $labels.{label} }}}}, unlike the cluster's "
            "majority.",
            labels={"setting": setting},
        )
        for setting, values, label in settings
    ]
