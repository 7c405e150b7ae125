"""``transformer_wskip``: Admin's w_skip variant of fairseq's Post-LN Transformer.

Every residual of the Post-LN Transformer, ``LN(x + f(x))``, becomes ``LN(x * ω + f(x))`` with a
learnable vector ω of shape ``(embed_dim,)``: two per encoder layer (``omega_self_attn``,
``omega_ffn``) and three per decoder layer (``omega_self_attn``, ``omega_encoder_attn``,
``omega_ffn``). The layers are fairseq's own :class:`TransformerEncoderLayerBase` /
:class:`TransformerDecoderLayerBase`; only their ``residual_connection`` hook (which fairseq's
``forward`` calls for every residual) is overridden.

``--wskip-init`` sets ω at initialization:

* ``ones`` (default): ω = 1, the model starts as the plain Post-LN Transformer. This is the variant
  GradInit runs on: ω is a parameter tensor like any other and gets its own scale.
* ``admin``: Admin's profiling rule (:class:`fairseq_gradinit.core.admin.AdminProfile`), run by
  :func:`admin_profile_if_requested` in the same process before the first update (and before
  GradInit when both are on). The batch is the first one of epoch 1 of fairseq's training batch
  iterator built with fairseq-train's batching options (``--max-tokens``, ``--batch-size``,
  ``--required-batch-size-multiple``, ``--seed``), unsharded: the batch a one-GPU run trains on
  first. The model runs one forward pass in train mode (dropout on) without gradients; for each
  stack, ω_1 = 1 and ω_{i+1} = sqrt(Var[x_i ω_i] + Var[f_i(x_i)]), population variances over all
  entries of the (time, batch, channel) tensors, padding included, as Admin's released code
  computes them. Every rank computes the same values and rank 0's are broadcast, so all ranks end
  identical. The random-number state is restored afterwards.
* ``admin-closed-form``: the ``admin-torch`` package's rule (``calculate_init``, default
  'O(logn)'), ω = sqrt((N + 1) / ln(N + 1) - 1), with N = 2 x encoder layers for the encoder and
  N = 3 x decoder layers for the decoder (the number of residuals in each stack).

Pre-LN (``--encoder-normalize-before`` / ``--decoder-normalize-before``) is rejected: w_skip is
defined on the Post-LN residual.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.distributed as dist
from fairseq import utils
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from ...core.admin import AdminProfile, closed_form_omega
from ..data.files import atomic_write_json
from ..data.training import training_dataset, training_iterator
from ..settings.validation import check_every_parse

logger = logging.getLogger(__name__)

WSKIP_INITS = ("ones", "admin", "admin-closed-form")
ADMIN_JSON = "wskip_admin.json"


def pre_ln_refusal(args) -> Optional[tuple]:
    """(flag, why) when ``args`` (a parsed namespace or the model's arguments) asks for a Pre-LN
    side, which w_skip does not define; None for Post-LN. The one refusal of Pre-LN: the parser
    reports it (:func:`wskip_argument_error`), and :meth:`WSkipTransformerModel.build_model` raises
    it for models configured otherwise."""
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_normalize_before", False):
            flag = f"--{side}-normalize-before"
            return flag, (f"transformer_wskip is Admin's w_skip variant of the Post-LN Transformer ({flag}, Pre-LN, "
                          "is not supported); drop the flag, or use a transformer_* architecture for Pre-LN")
    return None


def nonnegative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (a seed numpy and torch accept)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid value {value}: expected an integer >= 0")
    return value


def wskip_argument_error(ns) -> Optional[str]:
    """'argument --FLAG: ...' when a parsed command line asks for a Pre-LN transformer_wskip or gives
    --wskip-profile-seed without --wskip-init admin (refused when parsed, exit status 2), or None."""
    arch = str(getattr(ns, "arch", "") or "")
    if not arch.startswith("transformer_wskip"):
        return None
    seed = getattr(ns, "wskip_profile_seed", None)
    if seed is not None and getattr(ns, "wskip_init", "ones") != "admin":
        return (f"argument --wskip-profile-seed: not allowed with --wskip-init {getattr(ns, 'wskip_init', 'ones')}: "
                "it picks the model that Admin's profiling runs on; add --wskip-init admin or drop it")
    refusal = pre_ln_refusal(ns)
    if refusal is not None:
        flag, why = refusal
        return f"argument {flag}: not allowed with --arch {arch}: {why}"
    return None


check_every_parse(wskip_argument_error)


class _OmegaResidual:
    """``residual_connection`` with ω: fairseq's layers call it once per residual, in order."""

    omega_names: tuple = ()
    #: Set during Admin's profiling: called as observer(layer, omega_name, branch, shortcut).
    _wskip_observer = None

    def _add_omegas(self, names, embed_dim: int) -> None:
        self.omega_names = tuple(names)
        for name in self.omega_names:
            self.register_parameter(name, nn.Parameter(torch.ones(embed_dim)))

    def _begin_residuals(self, order) -> None:
        self._wskip_order = order
        self._wskip_next = 0

    def residual_connection(self, x, residual):
        name = self._wskip_order[self._wskip_next]
        self._wskip_next += 1
        omega = getattr(self, name)
        if self._wskip_observer is not None:
            self._wskip_observer(self, name, x, residual)
        return residual * omega + x


class WSkipEncoderLayer(_OmegaResidual, TransformerEncoderLayerBase):
    """fairseq's encoder layer with ω on its two residuals (self-attention, FFN)."""

    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self._add_omegas(("omega_self_attn", "omega_ffn"), self.embed_dim)

    def forward(self, x, encoder_padding_mask, attn_mask=None):
        self._begin_residuals(self.omega_names)
        return super().forward(x, encoder_padding_mask, attn_mask=attn_mask)


class WSkipDecoderLayer(_OmegaResidual, TransformerDecoderLayerBase):
    """fairseq's decoder layer with ω on its three residuals (self-attention, encoder attention, FFN)."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)
        names = ("omega_self_attn", "omega_ffn") if self.encoder_attn is None else \
            ("omega_self_attn", "omega_encoder_attn", "omega_ffn")
        self._add_omegas(names, self.embed_dim)

    def forward(self, x, encoder_out=None, *args, **kwargs):
        # fairseq skips the encoder-attention block (and its residual) without encoder output.
        order = self.omega_names if encoder_out is not None else ("omega_self_attn", "omega_ffn")
        self._begin_residuals(order)
        return super().forward(x, encoder_out, *args, **kwargs)


def _wrap_layer(layer, cfg):
    # The same activation-checkpointing / FSDP wrapping fairseq applies to its own layers.
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class WSkipTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return _wrap_layer(WSkipEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class WSkipTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(WSkipDecoderLayer(cfg, no_encoder_attn), cfg)


@dataclass
class AdminBatchOptions:
    """fairseq-train's batching options, kept from the training arguments for Admin's profiling."""

    max_tokens: Optional[int] = None
    batch_size: Optional[int] = None
    required_batch_size_multiple: int = 8
    seed: int = 1
    cpu: bool = False
    save_dir: Optional[str] = None

    @classmethod
    def from_args(cls, args) -> "AdminBatchOptions":
        def get(key, default):
            value = getattr(args, key, None)
            return default if value is None else value

        return cls(max_tokens=get("max_tokens", None), batch_size=get("batch_size", None),
                   required_batch_size_multiple=int(get("required_batch_size_multiple", 8)),
                   seed=int(get("seed", 1)), cpu=bool(get("cpu", False)), save_dir=get("save_dir", None))


@register_model("transformer_wskip")
class WSkipTransformerModel(TransformerModel):
    """fairseq's ``transformer`` with Admin's w_skip residuals (see the module docstring)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--wskip-init", choices=WSKIP_INITS, default="ones",
                            help="initialization of the residual scales omega: ones (plain Post-LN, the "
                                 "GradInit variant), admin (Admin's profiling on the first training batch) "
                                 "or admin-closed-form (the admin-torch package's rule)")
        parser.add_argument("--wskip-profile-seed", type=nonnegative_int, default=None, metavar="SEED",
                            help="--wskip-init admin: profile a twin model built and batched with this seed and "
                                 "copy its omega (the Admin authors profile once with seed 1111 and reuse omega for "
                                 "every seed); default: profile this run's own model with --seed")

    @classmethod
    def build_model(cls, args, task):
        refusal = pre_ln_refusal(args)  # the layers are built only here, from these arguments
        if refusal is not None:
            raise ValueError(refusal[1])
        init = getattr(args, "wskip_init", None) or "ones"
        if init not in WSKIP_INITS:
            raise ValueError(f"--wskip-init {init!r} is not one of {', '.join(WSKIP_INITS)}")
        model = super().build_model(args, task)
        model.wskip_init = init
        model.admin_batch_options = AdminBatchOptions.from_args(args)
        profile_seed = getattr(args, "wskip_profile_seed", None)
        if profile_seed is not None and init != "admin":
            raise ValueError(f"--wskip-profile-seed {profile_seed} needs --wskip-init admin (got {init})")
        model.admin_profile_seed = profile_seed
        # what a twin for --wskip-profile-seed is built from (with the task the profile is given)
        model.admin_build_args = copy.copy(args) if profile_seed is not None else None
        # Training must not start from the placeholder ω = 1 of an un-profiled admin model; loading
        # a checkpoint (resume, inference) or running the profile clears this.
        model.admin_pending = init == "admin"
        if init == "admin-closed-form":
            apply_closed_form_omega(model)
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return WSkipTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return WSkipTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def before_first_update(self, task) -> None:
        """Called by the plugin's task on a freshly built training model, before GradInit and the
        first update: Admin's profiling with ``--wskip-init admin`` (:func:`admin_profile_if_requested`)."""
        admin_profile_if_requested(self, task)

    def load_state_dict(self, *args, **kwargs):
        self.admin_pending = False
        return super().load_state_dict(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self.training and getattr(self, "admin_pending", False):
            raise RuntimeError(
                "transformer_wskip with --wskip-init admin: omega has not been profiled yet. Train with "
                "--user-dir fairseq_gradinit and --task translation_gradinit (or translation), which runs "
                "the profile before the first update, or call "
                "fairseq_gradinit.fairseq_plugin.models.wskip.admin_profile(model, sample) yourself")
        return super().forward(*args, **kwargs)


def omega_parameters(model: nn.Module, side: str) -> Dict[str, nn.Parameter]:
    """``{name: ω}`` of the ``encoder`` or ``decoder`` stack, in forward order."""
    layer_type = WSkipEncoderLayer if side == "encoder" else WSkipDecoderLayer
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, layer_type):
            for omega_name in module.omega_names:
                out[f"{name}.{omega_name}" if name else omega_name] = getattr(module, omega_name)
    return out


def apply_closed_form_omega(model: nn.Module) -> Dict[str, float]:
    """Fill every ω with admin-torch's value for its stack (N = 2 x encoder layers, 3 x decoder layers)."""
    values = {}
    for side in ("encoder", "decoder"):
        omegas = omega_parameters(model, side)
        if not omegas:
            continue
        # N = the stack's number of residuals (2 per encoder layer, 3 per decoder layer).
        value = closed_form_omega(len(omegas))
        with torch.no_grad():
            for p in omegas.values():
                p.fill_(value)
        values[side] = value
        logger.info("wskip: admin-closed-form omega = %.6f for the %s (%d residuals)", value, side, len(omegas))
    return values


def admin_profile(model: nn.Module, sample: dict, *, device: Optional[torch.device] = None) -> Dict[str, float]:
    """Admin's profiling initialization of ``model``'s ω on one batch ``sample`` (fairseq format).

    One forward pass in train mode without gradients, on ``device`` (default: where the model is),
    with the random-number state restored afterwards; see the module docstring for the formula.
    With ``torch.distributed`` initialized, rank 0's ω are broadcast to all ranks. Returns
    ``{parameter name: ω}``.
    """
    profiles = {"encoder": AdminProfile(), "decoder": AdminProfile()}
    layers = [m for m in model.modules() if isinstance(m, (WSkipEncoderLayer, WSkipDecoderLayer))]
    if not layers:
        raise ValueError("admin_profile needs a transformer_wskip model (no w_skip layers found)")

    def observe(layer, name, branch, shortcut):
        side = "encoder" if isinstance(layer, WSkipEncoderLayer) else "decoder"
        profiles[side].visit(getattr(layer, name), branch, shortcut)

    orig_device = next(model.parameters()).device
    device = device or orig_device
    was_training, was_pending = model.training, getattr(model, "admin_pending", False)
    fork_devices = [device] if device.type == "cuda" else []
    try:
        model.admin_pending = False  # the profile's own forward pass
        model.to(device)
        sample = utils.apply_to_sample(lambda t: t.to(device), sample)
        for layer in layers:
            layer._wskip_observer = observe
        with torch.random.fork_rng(devices=fork_devices), torch.no_grad():
            model.train()
            model(**sample["net_input"])
        omegas = {**omega_parameters(model, "encoder"), **omega_parameters(model, "decoder")}
        for side, profile in profiles.items():
            expected = len(omega_parameters(model, side))
            if len(profile.omegas) != expected:
                raise ValueError(
                    f"Admin profiling visited {len(profile.omegas)} of the {expected} {side} residuals "
                    f"(LayerDrop skips layers in train mode): set --{side}-layerdrop 0 for --wskip-init admin")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for p in omegas.values():
                dist.broadcast(p.data, src=0)
        values = {name: float(p[0].detach()) for name, p in omegas.items()}
    except BaseException:
        model.admin_pending = was_pending
        raise
    finally:
        for layer in layers:
            layer._wskip_observer = None
        model.train(was_training)
        model.to(orig_device)
    return values


#: Below this many target tokens, Admin's one-batch variance estimates are noisy (a warning says so).
ADMIN_MIN_TOKENS = 256


def first_training_batch(task, model, options: AdminBatchOptions) -> dict:
    """The first batch of epoch 1 of fairseq's training iterator with fairseq-train's batching, unsharded."""
    if not options.max_tokens and not options.batch_size:
        raise ValueError("--wskip-init admin profiles one training batch: set --max-tokens or --batch-size")
    itr, _ = training_iterator(task, model, training_dataset(task), max_tokens=options.max_tokens,
                               batch_size=options.batch_size, seed=options.seed,
                               required_batch_size_multiple=options.required_batch_size_multiple)
    return next(iter(itr.next_epoch_itr(shuffle=True)))


def admin_profile_if_requested(model: nn.Module, task) -> Optional[Dict[str, float]]:
    """Run Admin's profiling on a freshly built training model with ``--wskip-init admin``.

    The task calls this before GradInit and before the first update; it does nothing (returns
    None) for any other model or ``--wskip-init``. Runs on the GPU unless ``--cpu`` (the model is
    moved back afterwards) and writes ``wskip_admin.json`` to ``--save-dir`` on rank 0.
    """
    if not isinstance(model, WSkipTransformerModel) or model.wskip_init != "admin":
        return None
    options = model.admin_batch_options
    use_cuda = torch.cuda.is_available() and not options.cpu
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    profile_seed = getattr(model, "admin_profile_seed", None)
    if profile_seed is None:
        sample = first_training_batch(task, model, options)
        values = admin_profile(model, sample, device=device)
    else:
        values, sample = _profile_twin(model, task, profile_seed, device)
        logger.info("wskip: omega profiled on a twin model built with seed %d (--wskip-profile-seed)", profile_seed)
    if use_cuda:
        torch.cuda.empty_cache()
    logger.info("wskip: Admin profiling on %d sentences (%d target tokens) on %s", sample["nsentences"],
                sample["ntokens"], device)
    if int(sample["ntokens"]) < ADMIN_MIN_TOKENS:
        logger.warning("wskip: WARNING: Admin profiling used one batch of only %d sentences (%d target tokens); "
                       "omega comes from that batch's output variances, which are noisy below %d tokens: raise "
                       "--max-tokens (or --batch-size)", sample["nsentences"], sample["ntokens"], ADMIN_MIN_TOKENS)
    for name, value in values.items():
        logger.info("  %-40s %.6f", name, value)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank == 0 and options.save_dir:
        atomic_write_json(os.path.join(options.save_dir, ADMIN_JSON),
                          {"omega": values, "nsentences": int(sample["nsentences"]), "ntokens": int(sample["ntokens"]),
                           "sample_ids": sample["id"].tolist(), "device": str(device), "profile_seed": profile_seed})
    return values


def _profile_twin(model: nn.Module, task, seed: int, device: torch.device):
    """Admin's ω from a twin of ``model`` built (and batched) as fairseq-train does with ``seed``,
    copied into ``model``; the random-number state is left as it was."""
    twin_args = copy.copy(model.admin_build_args)
    twin_args.seed = seed
    twin_args.wskip_profile_seed = None
    # The profile's dropout masks come from the random state too: build and profile the twin in one
    # forked state seeded as fairseq-train seeds a run, so that it equals the profile of a run with --seed.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        utils.set_torch_seed(seed)
        twin = type(model).build_model(twin_args, task)
        options = dataclasses.replace(model.admin_batch_options, seed=seed)
        sample = first_training_batch(task, twin, options)
        values = admin_profile(twin, sample, device=device)
    own = {**omega_parameters(model, "encoder"), **omega_parameters(model, "decoder")}
    with torch.no_grad():
        for name, value in values.items():
            own[name].fill_(value)
    model.admin_pending = False
    del twin
    return values, sample


# --------------------------------------------------------------------------------------------
# architectures: the hyperparameters of fairseq's transformer_* of the same name
# --------------------------------------------------------------------------------------------
def _wskip_defaults(args):
    if getattr(args, "wskip_init", None) is None:
        args.wskip_init = "ones"


@register_model_architecture("transformer_wskip", "transformer_wskip")
def wskip_base_architecture(args):
    _wskip_defaults(args)
    transformer_base_architecture(args)


@register_model_architecture("transformer_wskip", "transformer_wskip_iwslt_de_en")
def wskip_iwslt_de_en(args):
    _wskip_defaults(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_wskip", "transformer_wskip_wmt_en_de")
def wskip_wmt_en_de(args):
    _wskip_defaults(args)
    transformer_wmt_en_de(args)


@register_model_architecture("transformer_wskip", "transformer_wskip_wmt_en_de_big")
def wskip_wmt_en_de_big(args):
    _wskip_defaults(args)
    transformer_wmt_en_de_big(args)
