"""The ``--gradinit-*`` options of the fairseq plugin (fields of every served task's config).

The options of the engine are not declared here: their fields are generated from
:class:`~fairseq_gradinit.core.GradInitConfig` (help, choices, types), with the plugin's own
defaults in :data:`FAIRSEQ_DEFAULTS`. Declared here are only the options that exist for fairseq
alone (batches in tokens, init files) and the global settings the task reads.
"""
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from ...core.config import option
from ...core.options import OptionSpec, options_of
from ...core.recipes import recipe
from ...core.sdpa_guard import GUARD_MODES
from ..features.source_use import SOURCE_GAP_MODES

#: With Adam, what the plugin does unless told otherwise: gamma = this factor x ||g||_1 at the init, the
#: objective is the loss after this many simulated Adam steps, and tau is this: the setting whose Post-LN Transformer
#: reached the lowest loss without warmup on the CPU testbed, a model that ignores its source (docs/no-warmup.md).
NO_WARMUP_GAMMA_INIT_FACTOR = 2.0
NO_WARMUP_LOOKAHEAD_STEPS = 4
NO_WARMUP_TAU = 1e-2


def default_lookahead_steps(*, adam: bool, unstepped_uses) -> int:
    """The simulated steps a run gets without --gradinit-lookahead-steps: Adam's several, which move every
    use of a tensor; one with SGD or with --gradinit-unstepped-uses (the paper's single step)."""
    return NO_WARMUP_LOOKAHEAD_STEPS if adam and unstepped_uses is None else 1

#: The recipe the plugin's defaults start from: the authors' IWSLT'14 setting.
AUTHORS = recipe("authors-iwslt14")
#: Where the plugin's defaults depart from :data:`AUTHORS`, ``field -> (value, reason)``; None is derived
#: when the run starts (:func:`~.option_values.gradinit_config_from_task`, eta and gamma by
#: ``first_step(..., rule="fairseq")`` of :mod:`...core.config`). Every other value is the recipe's.
FAIRSEQ_DIFFERENCES = {
    "optimizer": (None, "the plugin serves any training command: GradInit prepares the first step of its "
                        "--optimizer (sgd for sgd/nag, else adam)"),
    "eta": (None, "the first step is the training's own: 2 x --lr for Adam (the authors' 1e-3 at their lr "
                  "5e-4), --lr for SGD (the paper)"),
    "gamma": (None, "the authors' 1e3 is 1/eta at their eta; with Adam the plugin measures gamma at the init "
                    "instead (gamma_init_factor), with SGD it takes the paper's sqrt(0.15/eta)"),
    "gamma_init_factor": (None, f"{NO_WARMUP_GAMMA_INIT_FACTOR:g} with Adam unless --gradinit-gamma is given: "
                                "a constraint that rarely binds (docs/no-warmup.md)"),
    "lookahead_steps": (None, f"{NO_WARMUP_LOOKAHEAD_STEPS} with Adam: the loss after several simulated steps "
                              "reached the lowest loss without warmup on the testbed, though its model ignored its "
                              "source (docs/no-warmup.md); "
                              "1 with SGD or --gradinit-unstepped-uses"),
    "unstepped_uses": (None, "the simulated Adam steps of the default objective move every use of a tensor, as "
                             "the real training does; --gradinit-unstepped-uses gives the authors' single step"),
    "lr": (None, f"tau {NO_WARMUP_TAU:g} with Adam (the testbed's setting, docs/no-warmup.md); the engine's "
                 "2.5e-3 with SGD"),
    "iters": (0, "GradInit runs only when asked for: the options are on every task the plugin serves"),
    "log_interval": (20, "progress in fairseq's log every 20 iterations: the engine's 50 gives a 780-iteration "
                        "phase 15 lines"),
    "max_tokens": (None, "(2 - overlap) x --max-tokens, so that S is one training batch (6144 at the authors' "
                         "--max-tokens 4096, where they drew 6000)"),
}
#: How the options' help states the plugin's defaults (``(default: ...)``).
FAIRSEQ_DEFAULT_TEXTS = {
    "optimizer": "follow --optimizer: sgd for sgd/nag, else adam",
    "eta": "2 x --lr for Adam (the authors' 1e-3 at lr 5e-4), --lr for SGD (the paper)",
    "gamma": "Adam: 2 x the gradient's 1-norm at the init (--gradinit-gamma-init-factor 2; the authors used 1e3, "
             "1/eta); SGD: sqrt(0.15/eta) (the paper's 1 at eta 0.15)",
    "lr": "1e-2 with Adam, 2.5e-3 with SGD (the authors' IWSLT tau, the engine's default)",
    "gamma_init_factor": "2 with Adam unless --gradinit-gamma is given; none with SGD",
    "lookahead_steps": "4 with Adam, 1 with SGD or --gradinit-unstepped-uses (the paper's single step)",
    "iters": "0, GradInit off; the paper runs 780",
    "adam_state": "per_branch, as the authors' fairseq code",
    "scale_bounds": "the authors' \"[('bias', 0, None), ('norm', None, 100)]\"; '[]' for the global bounds only",
    "log_interval": "20",
}
#: Where the plugin's defaults differ from the engine's: :data:`AUTHORS` with :data:`FAIRSEQ_DIFFERENCES`
#: (the research settings it turns on with Adam are among its main options).
FAIRSEQ_DEFAULTS = AUTHORS.defaults(FAIRSEQ_DIFFERENCES, texts=FAIRSEQ_DEFAULT_TEXTS,
                                    main=("gamma_init_factor", "lookahead_steps"))
#: The engine's options as the plugin offers them (prefix ``gradinit_``), with its defaults.
ENGINE_OPTIONS = tuple(options_of(defaults=FAIRSEQ_DEFAULTS, python_only=False))


def _field(spec: OptionSpec):
    """The fairseq dataclass field (type and default) of an engine option."""
    if spec.kind == "choice" or spec.kind == "bool":
        choices = list(spec.choices) if spec.kind == "choice" else ["true", "false"]
        typ = ChoiceEnum(choices)
        default = spec.default if spec.kind == "choice" else spec.to_text(spec.default)
    elif spec.kind in ("pair", "bounds"):
        typ, default = str, spec.to_text(spec.default)
    else:
        typ, default = {"float": float, "int": int, "str": str}[spec.kind], spec.default
    if spec.optional:
        typ = Optional[typ]
    return typ, field(default=default, metadata={"help": spec.help, "result": spec.result})


@dataclass
class PluginOptions(FairseqDataclass):
    """The ``--gradinit-*`` options that exist only for fairseq, and the global settings the task needs."""

    gradinit_max_tokens: Optional[int] = option(None, help=(
        "tokens drawn per GradInit iteration, split into S and S~, each 1/(2-overlap) of it (default: "
        "(2 - overlap) x --max-tokens, so that S is one training batch; the authors drew 6000 at --max-tokens 4096)"))
    gradinit_tied_embeddings: ChoiceEnum(["shared", "per-use"]) = option("shared", choices=("shared", "per-use"), help=(
        "scales of an embedding matrix used in several places (--share-all-embeddings: encoder input, decoder "
        "input, output projection; --share-decoder-input-output-embed: decoder input, output projection): one "
        "scale for all uses (shared), or one per use (per-use: the weight stays tied, each input use gets a "
        "multiplier saved in the checkpoint)"))
    gradinit_source_contrast: float = option(0.0, experimental=True, since="0.5.0", help=(
        "translation and other encoder-decoder tasks: GradInit's objective on S~ becomes L + w (L - L_rolled), "
        "L_rolled the loss with the sources rolled across the batch, so that the scales are chosen for steps "
        "that make the model use its source instead of silencing the encoder (a decoder that ignores its "
        "source lowers L as fast); one more forward/backward per objective iteration; 0: off (docs/remedies.md)"))
    gradinit_source_margin: float = option(0.0, experimental=True, since="0.5.0", help=(
        "with --gradinit-source-contrast w: reward source use only up to this gap, in bits per token: the "
        "objective on S~ becomes L + w max(0, margin - (L_rolled - L)), so that the scales are not pushed to "
        "widen the gap at the loss's expense once it is reached; 0: the linear contrast"))
    gradinit_init_file: Optional[str] = option(None, result=False, help=(
        "apply the scales of a saved gradinit.json instead of computing them (same architecture and --seed "
        "give the same weights)"))
    gradinit_checkpoint_interval: int = option(50, result=False, help=(
        "every this many GradInit iterations, save the phase's state (scales, their Adam moments, history: a few "
        "kilobytes) to --save-dir's gradinit.state.pt, so that the same command started again after a stop or "
        "a crash resumes the phase there instead of starting over; 0: never"))
    gradinit_init_clamp: Optional[str] = option(None, result=False, experimental=True, help=(
        "with --gradinit-init-file: clamp the file's scales into per-group bounds before applying them, same "
        "syntax as --gradinit-scale-bounds (first match wins; tensors no bound selects keep their scale), e.g. "
        "\"[('norm', 0.3, None), ('re:.', 0.1, None)]\"; the clamped scales are written to --save-dir's "
        "gradinit.json with the source file, its sha256, the bounds and every changed scale (a --save-dir whose "
        "gradinit.json holds other scales is refused)"))
    gradinit_monitor_interval: int = option(0, result=False, help=(
        "every N updates, append a record of the training's health to monitor.jsonl in --save-dir (0: off): fp16 "
        "overflows, skipped updates and the loss scale; at each overflow the parameters whose gradient was not "
        "finite, the module where it began (backward order), the batch's padded lengths and whether it has the "
        "cuDNN attention fault's signature; per layer the weight norm and the update/weight ratio of the last "
        "update; on a fixed batch in eval and train mode LayerNorm input std and gain, self-attention entropy "
        "and largest logit, branch/residual norm ratios, and the eval - train loss gap (a warning when it jumps); "
        "with or without GradInit (docs/monitor.md)"))
    gradinit_valid_dropout_loss: bool = option(False, result=False, help=(
        "at every validation, also score each batch with dropout on (the model in train mode, no gradient, "
        "dropout masks from --seed) and log it as loss_dropout beside loss: a run that breaks down in eval mode "
        "only shows it as loss rising above loss_dropout; with or without GradInit; does not change the training "
        "(docs/monitor.md)"))
    gradinit_source_gap: ChoiceEnum(list(SOURCE_GAP_MODES)) = option("auto", result=False, choices=SOURCE_GAP_MODES, help=(
        "at every validation, also score each batch with the sources rolled across the batch (sentence i gets "
        "sentence i-1's source; eval mode, no gradient) and log loss_src_rolled and src_gap (rolled minus plain "
        "loss, bits) beside loss, with a warning when the gap stays near 0 from update 500 on: a model that "
        "ignores its source (a silenced encoder) can have the lower validation loss and still translate every "
        "sentence alike; auto and on: for encoder-decoder tasks (language models are skipped with one log line), "
        "with or without GradInit; off: never (docs/monitor.md#source-use)"))
    gradinit_cudnn_sdpa_guard: ChoiceEnum(list(GUARD_MODES)) = option("auto", result=False, choices=GUARD_MODES, help=(
        "the guard against cuDNN attention's NaN query gradients at padded lengths 64 (mod 128) (torch 2.11 and "
        "later with cuDNN before 9.26, compute capability 9.x: Hopper GPUs): auto turns cuDNN attention off before "
        "the model first runs when this combination trains in fp16/bf16/amp (a later torch: after a test of the "
        "kernel), on always turns it off, off never does; with or without GradInit; logged once and recorded in "
        "gradinit.json and monitor.jsonl (docs/reliability.md)"))
    gradinit_progress_seconds: float = option(60.0, result=False, help=(
        "with GradInit (or an init file): during training, log a progress line (update, updates per second, mean "
        "loss since the last line, time left to --max-update) whenever this many seconds of wall time have "
        "passed, whatever --log-interval says; 0: off"))
    # Global settings the task needs; not command-line options of their own.
    # Typed Any, not bool/int: fairseq's namespace-to-config conversion casts bool/int fields, and
    # bool("${common.cpu}") is True, which would silently run GradInit on the CPU of GPU machines.
    gradinit_train_lr: Any = II("optimization.lr")
    gradinit_train_max_tokens: Any = II("dataset.max_tokens")
    gradinit_train_max_update: Any = II("optimization.max_update")
    gradinit_train_batch_size: Any = II("dataset.batch_size")
    gradinit_train_subset: Any = II("dataset.train_subset")
    gradinit_valid_subset: Any = II("dataset.valid_subset")
    gradinit_skip_invalid_valid: Any = II("dataset.skip_invalid_size_inputs_valid_test")
    gradinit_disable_validation: Any = II("dataset.disable_validation")
    gradinit_validate_after_updates: Any = II("dataset.validate_after_updates")
    gradinit_max_tokens_valid: Any = II("dataset.max_tokens_valid")
    gradinit_batch_size_valid: Any = II("dataset.batch_size_valid")
    gradinit_required_batch_size_multiple: Any = II("dataset.required_batch_size_multiple")
    gradinit_fp16: Any = II("common.fp16")
    gradinit_memory_efficient_fp16: Any = II("common.memory_efficient_fp16")
    gradinit_bf16: Any = II("common.bf16")
    gradinit_memory_efficient_bf16: Any = II("common.memory_efficient_bf16")
    gradinit_amp: Any = II("common.amp")
    gradinit_tpu: Any = II("common.tpu")
    gradinit_train_optimizer: Optional[str] = "${oc.select:optimizer._name,null}"
    gradinit_cpu: Any = II("common.cpu")
    gradinit_seed: Any = II("common.seed")
    gradinit_save_dir: str = II("checkpoint.save_dir")
    gradinit_restore_file: str = II("checkpoint.restore_file")
    gradinit_checkpoint_suffix: str = II("checkpoint.checkpoint_suffix")
    gradinit_finetune_from_model: Optional[str] = II("checkpoint.finetune_from_model")
    gradinit_continue_once: Optional[str] = II("checkpoint.continue_once")
    gradinit_reset_optimizer: Any = II("checkpoint.reset_optimizer")
    gradinit_reset_lr_scheduler: Any = II("checkpoint.reset_lr_scheduler")
    gradinit_reset_meters: Any = II("checkpoint.reset_meters")
    gradinit_reset_dataloader: Any = II("checkpoint.reset_dataloader")
    gradinit_ddp_backend: Any = II("distributed_training.ddp_backend")
    gradinit_pipeline_model_parallel: Any = II("distributed_training.pipeline_model_parallel")
    gradinit_model_parallel_size: Any = II("common.model_parallel_size")
    # Read by the training-setup checks (settings fairseq trips over only after the phase).
    gradinit_data: Any = II("task.data")
    gradinit_no_save: Any = II("checkpoint.no_save")
    gradinit_no_last_checkpoints: Any = II("checkpoint.no_last_checkpoints")
    gradinit_combine_valid_subsets: Any = II("dataset.combine_valid_subsets")
    gradinit_adam_betas: Any = "${oc.select:optimizer.adam_betas,null}"
    gradinit_adam_eps: Any = "${oc.select:optimizer.adam_eps,null}"


def _config_path(interpolation: str) -> list:
    """The config path of a global setting's interpolation (``${optimization.lr}``: ``["optimization", "lr"]``)."""
    return re.sub(r"^\$\{(oc\.select:)?", "", interpolation).split(",")[0].rstrip("}").split(".")


def _namespace_attribute(interpolation: str) -> str:
    """The ``fairseq-train`` namespace attribute of a global setting: the last name of its config
    path (``${optimization.lr}``: ``lr``), or the group of a ``_name`` (``optimizer._name``: ``optimizer``)."""
    path = _config_path(interpolation)
    return path[-2] if path[-1] == "_name" else path[-1]


#: The global settings the plugin reads: ``gradinit_*`` field -> the attribute of a parsed
#: ``fairseq-train`` namespace that holds it (read off the interpolations above, so that a task
#: config and a namespace give one plan, :mod:`.plan`).
GLOBAL_SETTINGS = {f.name: _namespace_attribute(f.default) for f in dataclasses.fields(PluginOptions)
                   if isinstance(f.default, str) and f.default.startswith("${")}


def fairseq_default(name: str):
    """The default fairseq declares for the global setting ``name`` (``gradinit_save_dir``: its
    ``checkpoint.save_dir``, ``checkpoints``): what a config that cannot resolve it would run with."""
    import typing

    from fairseq.dataclass.configs import FairseqConfig

    group, key = _config_path(PluginOptions.__dataclass_fields__[name].default)
    return typing.get_type_hints(FairseqConfig)[group].__dataclass_fields__[key].default


def options_dataclass(specs=ENGINE_OPTIONS, name: str = "GradInitOptions"):
    """A fairseq dataclass with a ``gradinit_<name>`` field per engine option and the plugin's own."""
    cls = dataclasses.make_dataclass(name, [("gradinit_" + s.name, *_field(s)) for s in specs], bases=(PluginOptions,))
    cls.__module__ = __name__
    cls.__doc__ = ("The ``--gradinit-*`` options, added to the dataclass of every fairseq task the plugin serves: "
                   "the engine's options (generated from GradInitConfig) and the plugin's own.")
    return cls


#: Every ``--gradinit-*`` option: the engine's (generated) and the plugin's own.
GradInitOptions = options_dataclass()


#: The plugin's own options (named without the ``gradinit_`` prefix of their fields, as the engine's).
PLUGIN_OPTIONS = tuple(dataclasses.replace(s, name=s.name[len("gradinit_"):]) for s in options_of(PluginOptions))


def plugin_result_options() -> tuple:
    """The plugin's own options that change the learned scales (``gradinit_*`` field names)."""
    return tuple("gradinit_" + s.name for s in PLUGIN_OPTIONS if s.result)


#: fairseq's own settings, read by the plan, that change GradInit's batches or arithmetic beyond what the
#: fingerprint records elsewhere (the model, criterion, seed, data, world size, and the tokens per
#: iteration, which ``--max-tokens`` sets): ``--batch-size`` caps the sentences of each GradInit batch
#: (:class:`~..data.batches.BatchSource`). The fingerprint records them beside the options.
RESULT_GLOBAL_SETTINGS = ("gradinit_train_batch_size",)


def option_table() -> str:
    """Every ``--gradinit-*`` option of the plugin as a Markdown table (docs/options.md's, generated)."""
    from ...command_line.option_forms import markdown_table

    return markdown_table(ENGINE_OPTIONS + PLUGIN_OPTIONS)
