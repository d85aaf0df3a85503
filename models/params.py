"""Where a model's parameters are: per component, per layer, and the FF / attention ratios.

`parameter_breakdown(model)` works on every model this project builds or loads: a
`BertEncoder` (or keras-hub `BertBackbone`), a `BertPretrainer`, and the fine-tuning models of
`models.heads` (classifier, regressor, token classifier, span extractor, sentence encoder,
bi-encoder trainer). It reads the model's own variables, so it counts what was built:

    embeddings   token, position and segment tables, their LayerNorm, and the E -> H
                 projection when the embeddings are factorized (ALBERT `embedding_dim`)
    layers       per Transformer layer: Q, K, V, attention output projection, attention
                 LayerNorm, feed-forward intermediate and output, feed-forward LayerNorm.
                 A shared layer (ALBERT `share_layers`) is ONE set of weights: it is listed and
                 counted once, with the layer positions it is applied at.
    pooler       the tanh dense on [CLS]
    heads        MLM transform (dense + LayerNorm) and output bias (the decoder is the token
                 embedding, already counted there), NSP/SOP, task heads

How things are counted: every number is a count of scalars. Each count is split into
`weights` (kernels and embedding tables), `biases` (bias vectors, including the MLM output
bias) and `layer_norm` (LayerNorm gamma + beta). A variable used in two places (the tied MLM
decoder, a shared layer) is counted once, so the total equals `model.count_params()`.

The ratios compare the feed-forward block with attention, over all (distinct) layers:
`ff_over_qkv` = (FF intermediate + FF output kernels) / (Q + K + V kernels) and
`ff_over_attention` = the same / (Q + K + V + attention output kernels), weights only;
`*_with_biases` add each block's biases. For BERT (FF width I = 4H) they are
2·H·I / 3·H² = 8/3 ≈ 2.67 and 2·H·I / 4·H² = 2.0 exactly; with biases, for BERT-Base,
(2·768·3072 + 3072 + 768) / (3·768² + 3·768) ≈ 2.665.

Command line (the `params` tool of `python -m pipeline`):

    python -m pipeline params --preset base                   # BERT-Base, Google's 30,522 vocab
    python -m pipeline params --preset tiny --vocab-size 8000 --embedding-size 64 --share-layers
    python -m pipeline params --model runs/default/pretrain/model.keras [--json]

The pretrain stage logs `params/params.json`, `params/params.txt` and `params_*` metrics to
its MLflow run (`pipeline.tracking.runs.log_parameter_breakdown`).

    >>> from models import build_pretrainer
    >>> breakdown = parameter_breakdown(build_pretrainer(100, "tiny", max_sequence_length=32))
    >>> breakdown.total == breakdown.model.count_params()
    True
    >>> round(breakdown.ratios["ff_over_qkv"], 3), breakdown.ratios["ff_over_attention"]
    (2.667, 2.0)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

WEIGHT_NAMES = ("kernel", "embeddings", "output_kernel")
LAYER_NORM_NAMES = ("gamma", "beta")

# The parts of a keras-hub TransformerEncoder, by the variable path inside the layer.
LAYER_PARTS = (
    ("query", "self_attention_layer/query/"),
    ("key", "self_attention_layer/key/"),
    ("value", "self_attention_layer/value/"),
    ("attention_output", "self_attention_layer/attention_output/"),
    ("attention_layer_norm", "self_attention_layer_norm/"),
    ("ff_intermediate", "feedforward_intermediate_dense/"),
    ("ff_output", "feedforward_output_dense/"),
    ("ff_layer_norm", "feedforward_layer_norm/"),
)
PART_TITLES = {"query": "Q", "key": "K", "value": "V", "attention_output": "attn out",
               "attention_layer_norm": "attn LN", "ff_intermediate": "FF in",
               "ff_output": "FF out", "ff_layer_norm": "FF LN", "other": "other"}

# Encoder components outside the Transformer layers: (name, attribute, group).
ENCODER_COMPONENTS = (
    ("token embeddings", "token_embedding", "embeddings"),
    ("position embeddings", "position_embedding", "embeddings"),
    ("segment embeddings", "segment_embedding", "embeddings"),
    ("embedding LayerNorm", "embeddings_layer_norm", "embeddings"),
    ("embedding projection (E -> H)", "embeddings_projection", "embeddings"),
    ("pooler", "pooled_dense", "pooler"),
)

HEAD_NAMES = {
    "mlm_head/intermediate_dense": "MLM transform dense",
    "mlm_head/intermediate_layer_norm": "MLM transform LayerNorm",
    "mlm_head/output_bias": "MLM output bias (decoder tied to token embeddings)",
    "mlm_head/output_kernel": "MLM decoder (untied)",
    "nsp_head": "NSP / SOP head",
}

COUNTING = ("counts of scalars; weights = kernels and embedding tables, biases = bias vectors "
            "(incl. the MLM output bias), layer_norm = LayerNorm gamma + beta; a variable used "
            "twice (tied MLM decoder, shared layer) is counted once; ratios: weights only, "
            "*_with_biases also count each block's biases")


class ParamsError(ValueError):
    """The model has no BERT encoder to break down, or the tool got bad input."""


@dataclasses.dataclass
class Count:
    """Scalars in some variables, split by kind."""

    weights: int = 0
    biases: int = 0
    layer_norm: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.biases + self.layer_norm

    def add(self, variable) -> None:
        size = _size(variable)
        name = variable.path.rsplit("/", 1)[-1]
        if name in WEIGHT_NAMES:
            self.weights += size
        elif name in LAYER_NORM_NAMES:
            self.layer_norm += size
        else:
            self.biases += size

    def __add__(self, other: "Count") -> "Count":
        return Count(self.weights + other.weights, self.biases + other.biases,
                     self.layer_norm + other.layer_norm)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "biases": self.biases, "layer_norm": self.layer_norm,
                "total": self.total}


@dataclasses.dataclass
class Component:
    name: str
    group: str  # embeddings | pooler | heads
    count: Count


@dataclasses.dataclass
class LayerCount:
    """One distinct Transformer layer: its parts and where it is applied."""

    name: str
    applied_at: list  # layer positions (0-based); several for a shared layer
    parts: dict  # part name (LAYER_PARTS) -> Count

    @property
    def count(self) -> Count:
        total = Count()
        for part in self.parts.values():
            total = total + part
        return total


@dataclasses.dataclass
class ParameterBreakdown:
    model: object
    architecture: dict
    components: list  # [Component] outside the Transformer layers, in model order
    layers: list  # [LayerCount], distinct layers in order
    total: int
    trainable: int

    def group(self, name: str) -> Count:
        """Sum over the components of a group: embeddings | pooler | heads."""
        total = Count()
        for component in self.components:
            if component.group == name:
                total = total + component.count
        return total

    def layers_total(self) -> Count:
        total = Count()
        for layer in self.layers:
            total = total + layer.count
        return total

    def part_total(self, *parts: str) -> Count:
        """Sum of the named layer parts over all distinct layers."""
        total = Count()
        for layer in self.layers:
            for part in parts:
                total = total + layer.parts.get(part, Count())
        return total

    @property
    def ratios(self) -> dict:
        qkv = self.part_total("query", "key", "value")
        attention = self.part_total("query", "key", "value", "attention_output")
        ff = self.part_total("ff_intermediate", "ff_output")

        def ratio(a, b):
            return a / b if b else float("nan")

        return {
            "ff_over_qkv": ratio(ff.weights, qkv.weights),
            "ff_over_attention": ratio(ff.weights, attention.weights),
            "ff_over_qkv_with_biases": ratio(ff.weights + ff.biases, qkv.weights + qkv.biases),
            "ff_over_attention_with_biases": ratio(ff.weights + ff.biases,
                                                   attention.weights + attention.biases),
        }

    def summary(self) -> dict:
        """The headline numbers (also the MLflow metrics, prefixed `params_`)."""
        return {
            "total": self.total,
            "trainable": self.trainable,
            "non_trainable": self.total - self.trainable,
            "embeddings": self.group("embeddings").total,
            "transformer_layers": self.layers_total().total,
            "per_layer": self.layers[0].count.total if self.layers else 0,
            "pooler": self.group("pooler").total,
            "heads": self.group("heads").total,
        }

    def to_dict(self) -> dict:
        return {
            "model": type(self.model).__name__,
            "architecture": self.architecture,
            "counting": COUNTING,
            **self.summary(),
            "components": [{"name": c.name, "group": c.group, **c.count.to_dict()}
                           for c in self.components],
            "layers": [{"name": layer.name, "applied_at": layer.applied_at,
                        **layer.count.to_dict(),
                        "parts": {k: v.to_dict() for k, v in layer.parts.items()}}
                       for layer in self.layers],
            "ratios": self.ratios,
        }

    def format_table(self) -> str:
        return format_table(self)


# ---------------------------------------------------------------------------
# Counting.
# ---------------------------------------------------------------------------
def _size(variable) -> int:
    size = 1
    for dim in variable.shape:
        size *= int(dim)
    return size


def find_encoder(model):
    """The BERT encoder inside `model` (the model itself, `.backbone`, `.encoder.backbone`)."""
    seen = set()
    stack = [model]
    while stack:
        node = stack.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if hasattr(node, "transformer_layers") and hasattr(node, "token_embedding"):
            return node
        for attr in ("backbone", "encoder"):
            try:
                stack.append(getattr(node, attr, None))
            except Exception:  # noqa: BLE001 - a property that cannot answer: not this path
                continue
    raise ParamsError(f"{type(model).__name__} holds no BERT encoder (a model with "
                      f"token_embedding and transformer_layers); nothing to break down")


def _architecture(encoder) -> dict:
    keys = ("vocabulary_size", "num_layers", "hidden_dim", "num_heads", "intermediate_dim",
            "max_sequence_length", "num_segments", "embedding_dim", "share_layers")
    arch = {key: getattr(encoder, key, None) for key in keys}
    arch["embedding_dim"] = int(encoder.token_embedding.output_dim)
    arch["share_layers"] = bool(arch["share_layers"])
    return arch


def parameter_breakdown(model) -> ParameterBreakdown:
    """Counts `model`'s parameters per component and per Transformer layer (see the module doc)."""
    encoder = find_encoder(model)
    counted: set = set()  # ids of variables already assigned to a component

    def count_of(variables) -> Count:
        count = Count()
        for variable in variables:
            if id(variable) not in counted:
                counted.add(id(variable))
                count.add(variable)
        return count

    components = []
    for name, attribute, group in ENCODER_COMPONENTS[:-1]:  # the pooler goes after the layers
        layer = getattr(encoder, attribute, None)
        if layer is not None and layer.weights:
            components.append(Component(name, group, count_of(layer.weights)))

    layers: list[LayerCount] = []
    by_id: dict = {}
    for position, layer in enumerate(encoder.transformer_layers):
        if id(layer) in by_id:  # a shared layer: counted once, applied again here
            by_id[id(layer)].applied_at.append(position)
            continue
        parts = {part: Count() for part, _ in LAYER_PARTS}
        for variable in layer.weights:
            if id(variable) in counted:
                continue
            counted.add(id(variable))
            inside = variable.path.split(layer.name + "/", 1)[-1]
            part = next((p for p, prefix in LAYER_PARTS if inside.startswith(prefix)), "other")
            parts.setdefault(part, Count()).add(variable)
        entry = LayerCount(layer.name, [position], parts)
        by_id[id(layer)] = entry
        layers.append(entry)

    name, attribute, group = ENCODER_COMPONENTS[-1]
    pooler = getattr(encoder, attribute, None)
    if pooler is not None and pooler.weights:
        components.append(Component(name, group, count_of(pooler.weights)))
    rest = [v for v in encoder.weights if id(v) not in counted]
    if rest:
        components.append(Component("other encoder variables", "embeddings", count_of(rest)))

    # Everything else in the model: heads, grouped by their variable path.
    heads: dict[str, Count] = {}
    for variable in model.weights:
        if id(variable) in counted:
            continue
        counted.add(id(variable))
        path = variable.path
        key = next((k for k in HEAD_NAMES if path == k or path.startswith(k + "/")), None)
        title = HEAD_NAMES[key] if key else f"task head {path.split('/', 1)[0]}"
        heads.setdefault(title, Count()).add(variable)
    order = list(HEAD_NAMES.values())
    ranked = sorted(heads.items(), key=lambda item: order.index(item[0]) if item[0] in order
                    else len(order))  # MLM transform, output bias, NSP, then task heads
    components += [Component(title, "heads", count) for title, count in ranked]

    unique = {id(v): v for v in model.weights}
    trainable = {id(v) for v in model.trainable_weights}
    return ParameterBreakdown(
        model=model, architecture=_architecture(encoder), components=components, layers=layers,
        total=sum(_size(v) for v in unique.values()),
        trainable=sum(_size(v) for i, v in unique.items() if i in trainable))


# ---------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------
def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:5.1f}%" if total else "     -"


def format_table(breakdown: ParameterBreakdown) -> str:
    b, arch = breakdown, breakdown.architecture
    total = b.total
    shared = any(len(layer.applied_at) > 1 for layer in b.layers)
    lines = [
        f"{type(b.model).__name__}: vocabulary {arch['vocabulary_size']:,}, "
        f"{arch['num_layers']} layers, hidden {arch['hidden_dim']}, {arch['num_heads']} heads, "
        f"feed-forward {arch['intermediate_dim']}, embeddings {arch['embedding_dim']}"
        + (" (factorized)" if arch["embedding_dim"] != arch["hidden_dim"] else "")
        + (", layers SHARED" if shared else ""),
        "",
        f"{'component':<52}{'weights':>13}{'biases':>11}{'LayerNorm':>11}{'total':>13}{'%':>8}",
    ]

    def row(name, count, indent="  "):
        lines.append(f"{indent + name:<52}{count.weights:>13,}{count.biases:>11,}"
                     f"{count.layer_norm:>11,}{count.total:>13,}  {_pct(count.total, total)}")

    def section(title, group):
        items = [c for c in b.components if c.group == group]
        if items:
            lines.append(title)
            for component in items:
                row(component.name, component.count)

    section("embeddings", "embeddings")
    lines.append("Transformer layers" + (" (one shared set of weights)" if shared else ""))
    for layer in b.layers:
        where = (f"layers {layer.applied_at[0]}-{layer.applied_at[-1]} ({len(layer.applied_at)}x)"
                 if len(layer.applied_at) > 1 else f"layer {layer.applied_at[0]}")
        row(f"{where}: {layer.name}", layer.count)
    section("pooler", "pooler")
    section("heads", "heads")
    lines.append("-" * 108)
    row("total", Count(sum(c.count.weights for c in b.components) + b.layers_total().weights,
                       sum(c.count.biases for c in b.components) + b.layers_total().biases,
                       sum(c.count.layer_norm for c in b.components)
                       + b.layers_total().layer_norm), indent="")
    lines.append(f"trainable {b.trainable:,}   non-trainable {b.total - b.trainable:,}")

    if b.layers:
        parts = [p for p in PART_TITLES if any(p in layer.parts for layer in b.layers)]
        lines += ["", "per Transformer layer (weights + biases + LayerNorm)",
                  f"{'layer':<24}" + "".join(f"{PART_TITLES[p]:>11}" for p in parts)
                  + f"{'total':>12}"]
        for layer in b.layers:
            label = layer.name if len(layer.applied_at) == 1 else \
                f"{layer.name} x{len(layer.applied_at)}"
            lines.append(f"{label:<24}" + "".join(
                f"{layer.parts.get(p, Count()).total:>11,}" for p in parts)
                + f"{layer.count.total:>12,}")
        r = b.ratios
        lines += ["", "feed-forward vs attention (all distinct layers):",
                  f"  FF / QKV                     {r['ff_over_qkv']:.3f} weights only "
                  f"({r['ff_over_qkv_with_biases']:.3f} with biases)",
                  f"  FF / (QKV + attention out)   {r['ff_over_attention']:.3f} weights only "
                  f"({r['ff_over_attention_with_biases']:.3f} with biases)"]
    lines += ["", f"counting: {COUNTING}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line: python -m pipeline params ...
# ---------------------------------------------------------------------------
def build_from_preset(preset: str, vocabulary_size: int, embedding_dim=None,
                      share_layers: bool = False, max_sequence_length: int = 512):
    """A `BertPretrainer` (encoder + MLM + NSP heads) of a preset size, random weights."""
    from models import presets
    from models.bert import BertEncoder
    from models.pretraining import BertPretrainer

    if preset not in presets.PRESETS:
        raise ParamsError(f"unknown preset {preset!r}; choose one of: {', '.join(presets.PRESETS)}")
    if vocabulary_size < 1:
        raise ParamsError(f"--vocab-size {vocabulary_size} must be a positive integer")
    hidden = presets.PRESETS[preset]["hidden_dim"]
    if embedding_dim is not None and not 1 <= embedding_dim <= hidden:
        raise ParamsError(f"--embedding-size {embedding_dim} must be between 1 and the hidden "
                          f"size {hidden} of preset {preset!r}")
    encoder = BertEncoder.from_preset_name(
        preset, vocabulary_size, embedding_dim=embedding_dim, share_layers=share_layers,
        max_sequence_length=max_sequence_length)
    return BertPretrainer(encoder, compile=False)


def load_keras(path) -> object:
    path = Path(path)
    if not path.is_file() or path.suffix != ".keras":
        raise ParamsError(f"--model {path}: not a .keras file (a SavedModel directory has no "
                          f"layer structure to break down; pass the model.keras beside it)")
    import warnings

    from models import load_keras  # registers every class of the package first

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return load_keras(path, compile=False)
    except Exception as err:  # noqa: BLE001 - reported as bad input
        raise ParamsError(f"could not load {path} as a Keras model: {err}") from err


def build_parser() -> argparse.ArgumentParser:
    """params' parser (docs/cli.md is generated from it)."""
    from models import presets

    parser = argparse.ArgumentParser(
        prog="python -m pipeline params",
        description="Parameter counts of a BERT model per component and per layer, and the "
                    "feed-forward / attention ratios.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a .keras model (pretrainer, encoder or fine-tuned)")
    source.add_argument("--preset", choices=list(presets.PRESETS),
                        help="build a random pretrainer of this size")
    parser.add_argument("--vocab-size", type=int, default=presets.GOOGLE_VOCAB_SIZE,
                        help=f"with --preset (default {presets.GOOGLE_VOCAB_SIZE:,}, Google's "
                             f"English vocab)")
    parser.add_argument("--embedding-size", type=int, default=None,
                        help="with --preset: ALBERT factorized embeddings of this width")
    parser.add_argument("--share-layers", action="store_true",
                        help="with --preset: ALBERT cross-layer parameter sharing")
    parser.add_argument("--max-sequence-length", type=int, default=512,
                        help="with --preset: position table size (default 512)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return parser


def main(argv=None) -> int:
    """`python -m pipeline params ...` (argv[0] may be the command name "params")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "params":
        argv = argv[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2), already printed
        return int(exit_.code or 0)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        if args.model:
            if args.embedding_size is not None or args.share_layers:
                raise ParamsError("--embedding-size / --share-layers go with --preset; a --model "
                                  "file already has its architecture")
            model = load_keras(args.model)
        else:
            model = build_from_preset(args.preset, args.vocab_size, args.embedding_size,
                                      args.share_layers, args.max_sequence_length)
        breakdown = parameter_breakdown(model)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(breakdown.to_dict(), indent=2) if args.json else breakdown.format_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
