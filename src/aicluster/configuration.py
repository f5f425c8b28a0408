"""The scheduler configuration file: one schema, read by the live cluster and the simulator.

``aicluster up --config FILE``, ``aicluster config apply FILE`` and ``aicluster sim --config
FILE`` all go through :func:`parse_configuration`, and turn the result into what each side runs
with the functions below (:func:`scheduler_config`, :func:`sim_config`, :func:`loop_options`),
so a replay and the live cluster decide from the same settings. With no file both use
``Configuration()``, whose defaults are the documented ones (``docs/config.md``).

A bad file raises :class:`~aicluster.core.ConfigError` naming the file, the key and its line.
Tenants, quotas and weights live in the store; a ``tenants`` section only seeds missing tenants
at ``up``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from aicluster.core import ConfigError, Tenant
from aicluster.core.configfile import load_mapping, tenants_from
from aicluster.core.job import priority_of
from aicluster.core.power import PowerPolicy
from aicluster.scheduler import SchedulerConfig, names
from aicluster.scheduler.locality import BUILT_IN_TERMS
from aicluster.scheduler.rights import PreemptionRights, Reach, Reclaim
from aicluster.sim.config import SimConfig
from aicluster.sim.forecast import ForecastOptions
from aicluster.sim.predict import PredictionOptions

__all__ = [
    "Configuration",
    "HealthConfig",
    "ServingSection",
    "estimate_options",
    "loop_options",
    "parse_configuration",
    "prediction_options",
    "scheduler_config",
    "sim_config",
]

Seconds = Annotated[float, Field(ge=0, le=10 * 365 * 86_400)]
PositiveSeconds = Annotated[float, Field(gt=0, le=10 * 365 * 86_400)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The file's defaults are the internal forms' where those lie below this module (the
# scheduler's and the simulator's settings); the control loop's take the file's instead
# (control/settings.py). Each default is written once.
_SCHEDULER = SchedulerConfig()
_SIMULATOR = SimConfig()


class TiresiasOptions(_Section):
    thresholds_gpu_s: tuple[PositiveSeconds, ...] = Field(
        default=_SCHEDULER.tiresias_thresholds, max_length=16
    )
    promote_knob: Annotated[float, Field(ge=0, le=1000)] = _SCHEDULER.tiresias_promote_knob
    promote_backoff: Annotated[float, Field(ge=1, le=16)] = _SCHEDULER.tiresias_promote_backoff
    promote_backoff_after: Annotated[int, Field(ge=0, le=1000)] = (
        _SCHEDULER.tiresias_promote_backoff_after
    )

    @field_validator("thresholds_gpu_s")
    @classmethod
    def _increasing(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if list(value) != sorted(set(value)):
            raise ValueError("thresholds must be strictly increasing")
        return value


class PolicySection(_Section):
    name: str = _SCHEDULER.queue
    tiresias: TiresiasOptions = TiresiasOptions()

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in names():
            raise ValueError(f"unknown policy {value!r} (known: {', '.join(names())})")
        return value


_RIGHTS = _SCHEDULER.rights


class BorrowingRights(_Section):
    """What a job that would borrow may take (Kueue's ``borrowWithinCohort``)."""

    priority: Reach = _RIGHTS.borrowing_priority
    policy: Reach = _RIGHTS.borrowing_policy
    max_priority_threshold: int | None = _RIGHTS.max_priority_threshold


class RightsSection(_Section):
    """Who may take GPUs from whom (``aicluster.scheduler.rights``): reclaim by a job within
    its tenant's quota, the priority and the policy's rights of such a job, and a borrower's."""

    reclaim: Reclaim = _RIGHTS.reclaim
    priority: Reach = _RIGHTS.priority
    policy: Reach = _RIGHTS.policy
    borrowing: BorrowingRights = BorrowingRights()
    by_standing: bool = _RIGHTS.by_standing

    def rights(self) -> PreemptionRights:
        borrowing = self.borrowing
        return PreemptionRights(
            reclaim=self.reclaim,
            priority=self.priority,
            policy=self.policy,
            borrowing_priority=borrowing.priority,
            borrowing_policy=borrowing.policy,
            max_priority_threshold=borrowing.max_priority_threshold,
            by_standing=self.by_standing,
        )


class PreemptionSection(_Section):
    enabled: bool = _SCHEDULER.preemption
    grace_period_s: Annotated[float, Field(ge=0, le=3600)] = 10.0  # the loop's stop_grace_s
    max_victims: Annotated[int, Field(ge=1, le=100_000)] = _SCHEDULER.max_victims
    priority_gap: Annotated[int, Field(ge=1, le=1_000_000)] = _SCHEDULER.priority_gap
    rights: RightsSection = RightsSection()
    # Anti-thrashing (scheduler/protection.py): 0 turns each off.
    min_runtime_s: Seconds = _SCHEDULER.min_runtime_s
    cooldown_s: Seconds = _SCHEDULER.cooldown_s


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """What the gang health monitor (:mod:`aicluster.control.loop.health`) runs with: the health
    section less the loop's own two keys. Defined here, below the control plane, which reads
    this file. Its defaults are the health section's (:class:`HealthSection` takes them)."""

    hang_factor: float = 3.0
    hang_floor_s: float = 30.0
    startup_grace_s: float = 120.0  # before the first step (imports, rendezvous, data)
    straggler_factor: float = 1.3
    straggler_window: int = 10  # steps per rank considered
    straggler_patience: int = 5  # consecutive flagged observations before reporting
    straggler_min_s: float = 0.01  # and at least this much slower than the gang's median


#: The monitor's defaults, which the file's health section takes (written once, here).
_HEALTH = HealthConfig()


class HealthSection(_Section):
    hang_factor: Annotated[float, Field(gt=1, le=1000)] = _HEALTH.hang_factor
    hang_floor_s: PositiveSeconds = _HEALTH.hang_floor_s
    startup_grace_s: PositiveSeconds = _HEALTH.startup_grace_s
    straggler_factor: Annotated[float, Field(gt=1, le=1000)] = _HEALTH.straggler_factor
    straggler_window: Annotated[int, Field(ge=2, le=10_000)] = _HEALTH.straggler_window
    straggler_patience: Annotated[int, Field(ge=1, le=10_000)] = _HEALTH.straggler_patience
    straggler_min_s: Seconds = _HEALTH.straggler_min_s
    # The loop's own two keys: LoopSettings (control/settings.py) takes these defaults.
    cordon_stragglers: bool = False
    restart_backoff_s: tuple[Seconds, Seconds] = (2.0, 60.0)

    @field_validator("restart_backoff_s")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] > value[1]:
            raise ValueError("the first backoff cannot exceed the longest")
        return value


class FailureSection(_Section):
    enabled: bool = _SIMULATOR.failures
    gpu_hours_per_failure: PositiveSeconds = _SIMULATOR.gpu_hours_per_failure
    repair_s: Seconds = _SIMULATOR.repair_seconds


Sensitivity = Annotated[float, Field(ge=0, le=1)]


class CommunicationSection(_Section):
    """The simulator's communication model (``aicluster.sim.comm``): the sensitivity of a job
    whose trace gives none, by size class (a job takes the entry of the largest GPU count not
    above its own; none: 0, the model off)."""

    sensitivity_by_gpus: dict[Annotated[int, Field(ge=1)], Sensitivity] = Field(
        default_factory=dict, max_length=64
    )


class SimulationSection(_Section):
    checkpoint_interval_s: PositiveSeconds | None = _SIMULATOR.checkpoint_interval
    checkpoint_on_preemption: bool = _SIMULATOR.checkpoint_on_preemption
    restart_overhead_s: Seconds = _SIMULATOR.restart_overhead
    cycle_interval_s: Seconds = _SIMULATOR.cycle_interval
    failures: FailureSection = FailureSection()
    communication: CommunicationSection = CommunicationSection()
    #: Each node's dataset cache in the simulator (the real one's bound is the data store's).
    data_cache_gb: Annotated[float, Field(ge=0)] = _SIMULATOR.data_cache_bytes / 1e9


#: A term of the placement score the configuration may order (scheduler.locality).
PlacementTerm = Literal["level", "free_left_on_nodes", "nodes", "data_cached_bytes"]


def _built_in_terms() -> list[PlacementTerm]:
    return ["level", "free_left_on_nodes", "nodes"]  # scheduler.locality.BUILT_IN_TERMS


class PlacementSection(_Section):
    """How the scheduler places gangs: ``topology`` packs each into the narrowest domain that
    holds it; ``random`` draws its nodes (seeded by ``seed`` and the job's id), a baseline.

    ``preferences``: the placement score's terms in the order they decide. The built-in ones
    (``level``, ``free_left_on_nodes``, ``nodes``: the narrowest level, the best-fitting domain
    and node, the fewest nodes) always come first, in that order; optional terms listed here
    break ties among placements equal on those (``data_cached_bytes``: the most of the job's
    input bytes already in the chosen nodes' caches)."""

    strategy: Literal["topology", "random"] = _SCHEDULER.placement  # type: ignore[assignment]
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = _SCHEDULER.placement_seed
    preferences: list[PlacementTerm] = Field(default_factory=_built_in_terms, max_length=8)

    @field_validator("preferences")
    @classmethod
    def _built_in_first(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a placement term is listed twice")
        listed = any(term in BUILT_IN_TERMS for term in value)
        if listed and tuple(value[: len(BUILT_IN_TERMS)]) != BUILT_IN_TERMS:
            raise ValueError(
                f"the built-in terms come first, all of them, in the order "
                f"{', '.join(BUILT_IN_TERMS)} (the search ranks by them so), or none of them"
            )
        return value

    @property
    def optional_terms(self) -> tuple[str, ...]:
        return tuple(term for term in self.preferences if term not in BUILT_IN_TERMS)


class PowerSection(_Section):
    """Power saving: with ``suspend_after_s`` set, a node idle that long is powered down and
    resumed when the queue needs it (``aicluster.scheduler.power``); unset, every node stays on.
    The watts themselves are the cluster file's."""

    suspend_after_s: PositiveSeconds | None = None
    suspend_time_s: Seconds = 60.0
    resume_time_s: Seconds = 300.0
    min_nodes_on: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    min_nodes_on_per_rack: Annotated[int, Field(ge=0, le=100_000)] = 0
    resume_timeout_s: PositiveSeconds | None = None  # live only; None: twice resume_time_s

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """Older files stay readable where the old keys say nothing (``energy_aware: false``,
        ``power_cap_watts: null``, as the old defaults file); otherwise say where they went."""
        if not isinstance(data, Mapping):
            return data
        if "energy_aware" in data and data["energy_aware"] is not False:
            raise ValueError(
                "energy_aware was replaced by suspend_after_s: idle nodes are powered down "
                "after that many seconds and resumed when the queue needs them (docs/config.md)"
            )
        if data.get("power_cap_watts") is not None:
            raise ValueError(
                "power_cap_watts moved to the cluster file, as power_budget_w (beside the "
                "budgets of racks and circuits: docs/simulator.md, 'Power budgets')"
            )
        return {k: v for k, v in data.items() if k not in ("energy_aware", "power_cap_watts")}

    def policy(self) -> PowerPolicy | None:
        if self.suspend_after_s is None:
            return None
        return PowerPolicy(
            suspend_after=self.suspend_after_s,
            suspend_time=self.suspend_time_s,
            resume_time=self.resume_time_s,
            min_nodes_on=self.min_nodes_on,
            min_nodes_on_per_rack=self.min_nodes_on_per_rack,
            resume_timeout=self.resume_timeout_s,
        )


class ElasticSection(_Section):
    grow_after_s: Seconds = 30.0


class PredictionSection(_Section):
    """Predicted run times (``aicluster.sim.predict``) for jobs that give no duration_estimate:
    sjf, srtf and backfill read them. Off: the policies read the request (or, in a replay, the
    trace's true run time), exactly as before."""

    enabled: bool = False
    retrain_interval_s: PositiveSeconds = 86_400.0
    min_history: Annotated[int, Field(ge=1, le=10_000_000)] = 20


class EstimatesSection(_Section):
    """Estimated start times of queued jobs (``aicluster.sim.forecast``): the live loop runs the
    simulator forward from its state every ``interval_s``, ``horizon_s`` ahead, for the first
    ``max_jobs`` jobs of the queue."""

    enabled: bool = True
    interval_s: PositiveSeconds = 30.0
    horizon_s: PositiveSeconds = 7 * 86_400.0
    max_jobs: Annotated[int, Field(ge=1, le=10_000)] = 1000


class SchedulerSection(_Section):
    shortcuts: bool = _SCHEDULER.shortcuts


class ServingSection(_Section):
    """How a model deployment's replicas (jobs of kind ``service``) compete with batch jobs:
    their priority class and whether the scheduler may preempt them. The scheduler's own rules
    then decide (a higher priority preempts a lower, preemptible one)."""

    priority: str | int = "normal"
    preemptible: bool = True
    #: How long the load must want fewer replicas of an autoscaled version before one is given
    #: back (``serve.services.ServiceScaler``): a burst's gaps must not cost replicas that then
    #: queue again behind other jobs.
    scale_down_after_s: Annotated[float, Field(ge=0, le=3600)] = 30.0

    @field_validator("priority")
    @classmethod
    def _known_priority(cls, value: str | int) -> str | int:
        priority_of(value)  # ValueError names the classes
        return value

    @property
    def priority_value(self) -> int:
        return priority_of(self.priority)


class Configuration(_Section):
    """The whole file; every section optional (its defaults apply)."""

    policy: PolicySection = PolicySection()
    backfill: Literal["easy", "none"] = _SCHEDULER.backfill  # type: ignore[assignment]
    preemption: PreemptionSection = PreemptionSection()
    health: HealthSection = HealthSection()
    elastic: ElasticSection = ElasticSection()
    power: PowerSection = PowerSection()
    simulation: SimulationSection = SimulationSection()
    scheduler: SchedulerSection = SchedulerSection()
    serving: ServingSection = ServingSection()
    placement: PlacementSection = PlacementSection()
    prediction: PredictionSection = PredictionSection()
    estimates: EstimatesSection = EstimatesSection()

    def described(self) -> dict[str, Any]:
        """The configuration as plain data (what ``config show`` prints)."""
        return self.model_dump(mode="json")


def parse_configuration(
    text: str, source: str = "<config>"
) -> tuple[Configuration, dict[str, Tenant]]:
    """Validate a configuration file; returns it and the tenants it seeds (may be empty).

    Raises :class:`ConfigError` whose message names the file, the line and the key.
    """
    data = load_mapping(text, source)
    tenants = tenants_from(data, source) if "tenants" in data else {}
    body = {key: value for key, value in data.items() if key != "tenants"}
    try:
        return Configuration.model_validate(body), tenants
    except ValidationError as error:
        first = error.errors()[0]
        location = tuple(str(part) for part in first["loc"])
        key = ".".join(location) or "(top level)"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(source, _line_of(data, location), f"{key}: {message}") from None


def _line_of(data: Mapping[str, Any], location: tuple[str, ...]) -> int | None:
    """The line of the deepest key of ``location`` present in the file."""
    line: int | None = getattr(data, "line", None)
    where: Any = data
    for part in location:
        if not isinstance(where, Mapping) or part not in where:
            break
        line = getattr(where, "key_lines", {}).get(part, line)
        where = where[part]
    return line


# -- what each side runs with -----------------------------------------------------------------


def scheduler_config(config: Configuration, *, explain: bool = True) -> SchedulerConfig:
    """The scheduling cycle's settings (the simulator passes ``explain=False`` for speed)."""
    return SchedulerConfig(
        queue=config.policy.name,
        backfill=config.backfill,
        preemption=config.preemption.enabled,
        priority_gap=config.preemption.priority_gap,
        rights=config.preemption.rights.rights(),
        min_runtime_s=config.preemption.min_runtime_s,
        cooldown_s=config.preemption.cooldown_s,
        tiresias_thresholds=tuple(config.policy.tiresias.thresholds_gpu_s),
        tiresias_promote_knob=config.policy.tiresias.promote_knob,
        tiresias_promote_backoff=config.policy.tiresias.promote_backoff,
        tiresias_promote_backoff_after=config.policy.tiresias.promote_backoff_after,
        power=config.power.policy(),
        max_victims=config.preemption.max_victims,
        explain=explain,
        shortcuts=config.scheduler.shortcuts,
        placement=config.placement.strategy,
        placement_seed=config.placement.seed,
        placement_preferences=config.placement.optional_terms,
    )


def sim_config(config: Configuration, **overrides: Any) -> SimConfig:
    """The simulator's settings (``overrides``: SimConfig fields given on the command line)."""
    simulation = config.simulation
    values: dict[str, Any] = {
        "checkpoint_interval": simulation.checkpoint_interval_s,
        "checkpoint_on_preemption": simulation.checkpoint_on_preemption,
        "restart_overhead": simulation.restart_overhead_s,
        "cycle_interval": simulation.cycle_interval_s,
        "failures": simulation.failures.enabled,
        "gpu_hours_per_failure": simulation.failures.gpu_hours_per_failure,
        "repair_seconds": simulation.failures.repair_s,
        "comm_sensitivity": tuple(sorted(simulation.communication.sensitivity_by_gpus.items())),
        "data_cache_bytes": int(simulation.data_cache_gb * 1e9),
    }
    values.update({key: value for key, value in overrides.items() if value is not None})
    return SimConfig(**values)


def health_config(config: Configuration) -> HealthConfig:
    # The section's other two keys are the loop's own (see loop_options).
    return HealthConfig(
        **config.health.model_dump(exclude={"cordon_stragglers", "restart_backoff_s"})
    )


def loop_options(config: Configuration) -> dict[str, Any]:
    """The live control loop's settings besides the scheduler's (``ControlLoop`` keywords)."""
    return {
        "stop_grace_s": config.preemption.grace_period_s,
        "health": health_config(config),
        "backoff_s": tuple(config.health.restart_backoff_s),
        "cordon_stragglers": config.health.cordon_stragglers,
        "grow_after_s": config.elastic.grow_after_s,
        "prediction": prediction_options(config),
        "estimates": estimate_options(config),
    }


def estimate_options(config: Configuration) -> ForecastOptions | None:
    """The live loop's estimated starts' settings (None: off)."""
    section = config.estimates
    if not section.enabled:
        return None
    return ForecastOptions(section.interval_s, section.horizon_s, section.max_jobs)


def prediction_options(config: Configuration) -> PredictionOptions | None:
    """Predicted run times' settings, live and in the simulator (None: off)."""
    section = config.prediction
    if not section.enabled:
        return None
    return PredictionOptions(section.retrain_interval_s, section.min_history)
