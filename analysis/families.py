"""The families, one entry each: what the bench, the book and the tools know of a family.

Plain data, standard library only: the book reads it without torch, triton or the kernels, and
the bench without the book (`schema` turns the shape columns' type names into Arrow types; the
bench resolves `grid` and `kernels`). Adding a family: docs/kernels.md, "Adding a family".

Family names are the data's: a results folder holds `<name>.parquet`, whose rows say
`family=<name>`, and `--family <name>` measures it. Two names predate the rule that a family is
named as its op (`elementwise` runs add_mul, `layernorm` layer_norm): their `kernels` say so, and
no other table maps the two names (the committed references, every results folder and the CLI
keep the old ones; renaming them would rewrite committed data).
"""
from __future__ import annotations

from dataclasses import dataclass

SHAPE_TYPES = ("int", "str", "bool")


@dataclass(frozen=True)
class Op:
    """One op of a family's rows (their `op` column). label: its name in the book's tables (None:
    not named yet; each table shows the op's own name its way). word: which pass of its family
    it is, where the family has several ("fwd", "bwd", "fwd+bwd", "decode")."""
    label: str | None = None
    word: str = ""


@dataclass(frozen=True)
class Family:
    name: str
    # Dotted under the package: the modules whose code the family's Triton rows run, the scope of
    # its kernel hash (with the private modules they import; analysis/sources.py).
    kernels: tuple[str, ...]
    # "module:function" of analysis/bench: function(grid) -> the grid's problems.
    grid: str
    # Shape columns, in order -> "int", "str" or "bool" (schema.py: the Arrow types).
    shape: dict
    # The headline case: the first entry the data has (the later ones for runs that lack the
    # headline size, a smoke grid: their largest case). The bench's book grid runs its searching
    # baselines at the first alone.
    headlines: tuple
    ops: dict  # op -> Op, in the book's order
    # The family's name where the book compares families, every op of its file (None: not in the
    # findings nor the across-families chapter yet), and its headline case's name where that
    # differs (the summary's table and figures).
    label: str | None = None
    headline_label: str | None = None
    # Its name in the findings' verdict over every case where it is not compared elsewhere (the
    # LM head loss, the training rows); the compared families go by `label`.
    verdict_label: str | None = None
    # The op `book.data.load` gives where none is asked for (None: every op of the file).
    primary_op: str | None = None
    # Shape columns added after rows were committed without them, and the value those rows had.
    added_defaults: dict | None = None
    # The fused kernel's methods (its rows' `variant`), where it has several: tests/test_families.py
    # checks them against the kernel's own list, which the book cannot import.
    fused_methods: tuple = ()

    def __post_init__(self):
        bad = {c: t for c, t in self.shape.items() if t not in SHAPE_TYPES}
        if bad:
            raise ValueError(f"{self.name}: shape types must be one of {SHAPE_TYPES}: {bad}")
        if self.primary_op is not None and self.primary_op not in self.ops:
            raise ValueError(f"{self.name}: primary_op {self.primary_op} is not one of its ops")

    @property
    def public_op(self) -> str | None:
        """The public function its rows call (`kernels.<public_op>`): its kernel module's name
        (None for a family of several ops' modules)."""
        return self.kernels[0].rsplit(".", 1)[1] if len(self.kernels) == 1 else None

    @property
    def verdict_name(self) -> str | None:
        """Its name in the findings' verdict over every case (None: not in it)."""
        return self.label or self.verdict_label

    @property
    def findings_label(self) -> str | None:
        """The name of its headline case in the findings (None: not in them)."""
        return self.headline_label or self.label


_ENTRIES = (
    Family(
        "elementwise", kernels=("kernels.families.add_mul",), grid="elementwise:problems",
        shape={"n": "int", "z_kind": "str"},
        headlines=(dict(dtype="float32", z_kind="tensor", n=2**27),
                   dict(dtype="float32", z_kind="tensor"), dict(z_kind="tensor")),
        ops={"add_mul": Op("add-mul")}, label="add-mul"),
    Family(
        "softmax", kernels=("kernels.families.softmax",), grid="reductions:softmax_problems",
        shape={"rows": "int", "width": "int", "direction": "str"},
        headlines=(dict(dtype="float32", width=16384), dict(dtype="float32"), dict()),
        ops={"softmax": Op("softmax", "fwd"), "softmax_bwd": Op("softmax bwd", "bwd")},
        label="softmax", primary_op="softmax",
        # Forward only until its backward joined it.
        added_defaults={"direction": "fwd"}),
    Family(
        "layernorm", kernels=("kernels.families.layer_norm",),
        grid="reductions:layernorm_problems",
        shape={"rows": "int", "width": "int", "direction": "str"},
        headlines=(dict(dtype="float16", direction="fwd", width=16384), dict(direction="fwd")),
        ops={"layer_norm_fwd": Op("LayerNorm", "fwd"),
             "layer_norm_bwd": Op("LayerNorm bwd", "bwd")},
        label="LayerNorm", headline_label="LayerNorm fwd"),
    Family(
        "softmax_matmul", kernels=("kernels.families.softmax_matmul",),
        grid="attention:softmax_matmul_problems",
        shape={"batch": "int", "d1": "int", "d2": "int", "d3": "int"},
        headlines=(dict(precision="float16"), dict(precision="tf32"), dict()),
        ops={"softmax_matmul": Op("softmax(X) @ V")}, label="softmax(X) @ V"),
    Family(
        "attention", kernels=("kernels.families.attention",),
        grid="attention:all_attention_problems",
        # kv_heads, seq_k: added with grouped heads and KV caches (empty in older rows: = heads,
        # seq; book.data fills them so).
        shape={"batch": "int", "heads": "int", "seq": "int", "head_dim": "int", "causal": "bool",
               "kv_heads": "int", "seq_k": "int"},
        headlines=(dict(head_dim=128, seq=4096, causal=False), dict(causal=False)),
        ops={"attention_fwd": Op("attention", "fwd"),
             "attention_fwd_bwd": Op("attention fwd+bwd", "fwd+bwd"),
             "attention_decode": Op("decoding", "decode")},
        label="attention", headline_label="attention fwd", primary_op="attention_fwd"),
    Family(
        "matmul_softmax", kernels=("kernels.families.matmul_softmax",),
        grid="matmul_epilogue:matmul_softmax_problems",
        # x (m, k) @ weight (k, n): m is the batch B and n the classes C.
        shape={"m": "int", "k": "int", "n": "int"},
        headlines=(dict(precision="float16", m=4096, k=1024, n=128256),
                   dict(precision="float16")),
        ops={"matmul_softmax": Op("matmul + softmax")}, label="matmul + softmax",
        fused_methods=("simple", "tiled", "online", "two_pass_store", "store_softmax",
                       "split_k")),
    Family(
        "linear_act", kernels=("kernels.families.linear_act",),
        grid="matmul_epilogue:linear_act_problems",
        shape={"m": "int", "k": "int", "n": "int", "activation": "str"},
        # Its headline is GELU's: at a size where ReLU's rows tie on FLOPs.
        headlines=(dict(precision="float16", m=8192, activation="gelu"),
                   dict(precision="float16", activation="gelu"), dict(precision="float16")),
        ops={"linear_gelu": Op("linear + GELU"), "linear_relu": Op("linear + ReLU")},
        label="linear + act.", headline_label="linear + GELU"),
    Family(
        # Not (yet) in the findings: the bench's book grid reads its headline from here.
        "linear_cross_entropy", kernels=("kernels.families.linear_cross_entropy",),
        grid="matmul_epilogue:linear_cross_entropy_problems",
        shape={"tokens": "int", "hidden": "int", "vocab": "int"},
        headlines=(dict(precision="bfloat16", tokens=8192, hidden=768, vocab=50257), dict()),
        ops={"linear_cross_entropy_fwd_bwd": Op()}, verdict_label="LM head + loss"),
    Family(
        # Forward + backward through autograd, per call, of two ops: no kernel module of its own.
        "training", kernels=("kernels.families.layer_norm", "kernels.families.softmax"),
        grid="training:problems", shape={"rows": "int", "width": "int"},
        headlines=(dict(dtype="bfloat16", rows=4096, width=1024), dict()),
        ops={"layer_norm_fwd_bwd": Op(), "softmax_fwd_bwd": Op()},
        verdict_label="training fwd+bwd"),
)

FAMILIES: dict[str, Family] = {f.name: f for f in _ENTRIES}

# Views of the entries (edit the entries, not these).
# The families the findings and the across-families chapter compare, in the book's order.
COMPARED = tuple(f.name for f in _ENTRIES if f.label)
# The families of the findings' verdict over every case.
VERDICT = tuple(f.name for f in _ENTRIES if f.verdict_name)
# Every op of every family -> its Op; the labelled ones in the book's order.
OPS: dict[str, Op] = {op: o for f in _ENTRIES for op, o in f.ops.items()}
OP_LABEL: dict[str, str] = {op: o.label for op, o in OPS.items() if o.label}
