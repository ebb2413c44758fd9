"""Import a state dict of any module built on `torch.nn.Transformer` (or `nn.TransformerEncoder` +
`nn.TransformerDecoder`), as in PyTorch's translation tutorial.

The stacks are found by their own names (`<stack>.layers.<i>.self_attn.in_proj_weight`, `linear1`,
`norm1`...; a stack with `multihead_attn` is the decoder). The fused `in_proj_weight` / `in_proj_bias`
of `nn.MultiheadAttention` are split into query, key and value rows. Everything else is the user's
own code, named as they liked: the source and target embedding tables, the output Linear and the
position table are found by shape and role (a (vocab, d_model) table with a (vocab,) bias is the
output Linear; names with src / tgt hints tell the two embeddings apart; a table with `pos` in its
name or a singleton axis holds positions), or named with `--src-embedding`, `--tgt-embedding`,
`--generator`, `--positions`. When that is ambiguous the import is refused with the candidates.

What no weight records comes from options with nn.Transformer's own defaults: `norm_first`
(False: post-LN), `activation` (relu), `layer_norm_eps` (1e-5); and the tutorial's
`TokenEmbedding`, which scales by sqrt(d_model) (`scale_embedding`, default True). `batch_first`
does not change the weights: the bundle takes (batch, length) ids either way.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from xform.errors import CheckpointError
from xform.models import seeds
from xform.models.layers import sinusoid_table
from xform.models.transformer import Seq2SeqTransformer

ARCH = "torch-nn-transformer"
# options of this importer (beyond seeds.HPARAMS), with the defaults of nn.Transformer / the tutorial
OPTIONS = {"norm_first": False, "activation": "relu", "layer_norm_eps": 1e-5, "scale_embedding": True,
           "src_embedding": None, "tgt_embedding": None, "generator": None, "positions": None}
LAYER = re.compile(r"(?P<stack>(?:.*\.)?)layers\.(?P<i>\d+)\.(?P<rest>.+)")
SUBLAYER_NAMES = {"self_attn": "self_attn", "multihead_attn": "cross_attn"}
NORMS = {"enc": {"norm1": "attn_block", "norm2": "ffn_block"},
         "dec": {"norm1": "self_block", "norm2": "cross_block", "norm3": "ffn_block"}}
SRC_HINT = re.compile(r"src|source|enc|inp", re.I)
TGT_HINT = re.compile(r"tgt|trg|target|dec", re.I)


def is_torch_nn(state: dict[str, torch.Tensor]) -> bool:
    """Whether the keys hold nn.TransformerEncoderLayer / DecoderLayer stacks."""
    return any(re.fullmatch(r"(?:.*\.)?layers\.\d+\.self_attn\.(?:in_proj_weight|q_proj_weight)", k) for k in state) \
        and any(re.fullmatch(r"(?:.*\.)?layers\.\d+\.linear1\.weight", k) for k in state)


def stacks(state: dict[str, torch.Tensor], source: str) -> dict[str, str]:
    """{"enc": prefix, "dec": prefix} of the two layer stacks."""
    found: dict[str, set[str]] = {}
    for k in state:
        m = LAYER.fullmatch(k)
        if m and m["rest"].split(".")[0] in ("self_attn", "multihead_attn", "linear1", "linear2", "norm1", "norm2",
                                             "norm3"):
            found.setdefault(m["stack"], set()).add(m["rest"].split(".")[0])
    enc = [p for p, subs in found.items() if "multihead_attn" not in subs]
    dec = [p for p, subs in found.items() if "multihead_attn" in subs]
    if len(enc) != 1 or len(dec) != 1:
        raise CheckpointError(f"{source}: expected one nn.TransformerEncoder stack and one nn.TransformerDecoder stack "
                              f"(layers with multihead_attn); found encoder stacks {sorted(enc) or 'none'} and "
                              f"decoder stacks {sorted(dec) or 'none'}")
    return {"enc": enc[0], "dec": dec[0]}


def map_stack(state: dict[str, torch.Tensor], side: str, prefix: str, ours: dict[str, torch.Tensor],
              placed: set[str]) -> None:
    """xform names for one stack's layers; splits the fused in-projections."""
    our_stack = "encoder_layers" if side == "enc" else "decoder_layers"
    for k, t in state.items():
        m = LAYER.fullmatch(k)
        if not m or m["stack"] != prefix:
            continue
        head, _, param = m["rest"].partition(".")
        base = f"{our_stack}.{m['i']}"
        if head in SUBLAYER_NAMES and (side == "dec" or head == "self_attn"):
            attn = f"{base}.{SUBLAYER_NAMES[head]}"
            if param in ("in_proj_weight", "in_proj_bias"):
                kind = "weight" if param.endswith("weight") else "bias"
                for name, part in zip("qkv", t.chunk(3, dim=0)):
                    ours[f"{attn}.{name}_proj.{kind}"] = part
            elif param in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                ours[f"{attn}.{param[0]}_proj.weight"] = t
            elif param in ("out_proj.weight", "out_proj.bias"):
                ours[f"{attn}.{param}"] = t
            else:
                continue
        elif head in ("linear1", "linear2") and param in ("weight", "bias"):
            ours[f"{base}.ffn.fc{head[-1]}.{param}"] = t
        elif head in NORMS[side] and param in ("weight", "bias"):
            ours[f"{base}.{NORMS[side][head]}.norm.{param}"] = t
        else:
            continue
        placed.add(k)
    for param in ("weight", "bias"):
        k = f"{prefix}norm.{param}"
        if k in state:
            ours[f"{'encoder' if side == 'enc' else 'decoder'}_norm.{param}"] = state[k]
            placed.add(k)


def module_key(state: dict[str, torch.Tensor], ref: str, flag: str, source: str) -> str:
    """The key a --src-embedding / --tgt-embedding / --generator / --positions value names (the key
    itself, or a module name whose .weight / buffer it is)."""
    for cand in (ref, f"{ref}.weight", f"{ref}.embedding.weight"):
        if cand in state:
            return cand
    near = [k for k in state if k.startswith(ref.split(".")[0])][:6]
    raise CheckpointError(f"{source}: {flag} {ref!r} names no tensor in the state dict"
                          f"{'; keys starting alike: ' + ', '.join(near) if near else ''}")


def describe(state: dict[str, torch.Tensor], keys) -> str:
    return ", ".join(f"{k} {tuple(state[k].shape)}" for k in keys)


def position_tables(state: dict[str, torch.Tensor], keys: list[str], d: int, source: str) -> list[str]:
    """The position table (or one a side, source first) among `keys`: a (max_len, d) buffer or
    parameter with 'pos' in its name, or of shape (max_len, 1, d) / (1, max_len, d)."""
    def is_pos(k):
        t = state[k]
        return t.shape[-1] == d and ("pos" in k.lower() or k.rsplit(".", 1)[-1] in ("pe", "P")
                                     or (t.dim() == 3 and 1 in t.shape[:2]))

    cands = [k for k in keys if is_pos(k)]
    if not cands:
        raise CheckpointError(f"{source}: no position table found (a buffer or parameter with 'pos' in its name, "
                              "or "
                              f"of shape (max_len, 1, {d}) / (1, max_len, {d})); name it with --positions KEY, or "
                              "pass --positions sinusoidal if your code computes the paper's sinusoids unsaved")
    if len(cands) > 2:
        raise CheckpointError(f"{source}: several position tables: {describe(state, cands)}; "
                              "name the one to use with --positions KEY")
    if len(cands) == 2:  # one per side: source first
        cands.sort(key=lambda k: (not SRC_HINT.search(k), k))
        if not SRC_HINT.search(cands[0]) or not TGT_HINT.search(cands[1]):
            raise CheckpointError(f"{source}: two position tables and no src / tgt in their names tell which is "
                                  f"which: {describe(state, cands)}; name one with --positions KEY")
    return cands


def find_roles(state: dict[str, torch.Tensor], rest: list[str], d: int, opts: dict[str, Any],
               source: str) -> dict[str, Any]:
    """Which of the keys outside the stacks are the embeddings, the output Linear and positions."""
    roles: dict[str, Any] = {}
    for role, flag in (("src", "--src-embedding"), ("tgt", "--tgt-embedding"), ("gen", "--generator")):
        ref = opts[{"src": "src_embedding", "tgt": "tgt_embedding", "gen": "generator"}[role]]
        if ref is not None:
            roles[role] = module_key(state, ref, flag, source)
    pos_ref = opts["positions"]
    if pos_ref not in (None, "sinusoidal"):
        roles["pos"] = [module_key(state, pos_ref, "--positions", source)]
    taken = set(v for r, v in roles.items() if r != "pos") | set(roles.get("pos", []))

    if "pos" not in roles and pos_ref != "sinusoidal":
        roles["pos"] = position_tables(state, [k for k in rest if k not in taken], d, source)
        taken |= set(roles["pos"])
    tables = [k for k in rest if k not in taken and state[k].dim() == 2 and state[k].shape[1] == d
              and k.endswith("weight")]
    if "gen" not in roles:
        biased = [k for k in tables if state.get(k[: -len("weight")] + "bias") is not None
                  and tuple(state[k[: -len("weight")] + "bias"].shape) == (state[k].shape[0],)]
        if len(biased) != 1:
            named = [k for k in tables if re.search(r"generator|lm_head|out|proj|fc|classifier|head|logit", k, re.I)
                     and "emb" not in k.lower()]
            biased = biased if len(biased) > 1 or len(named) != 1 else named
        if len(biased) != 1:
            raise CheckpointError(f"{source}: cannot tell the output Linear (generator) among "
                                  f"{describe(state, biased or tables) or 'no (vocab, d_model) weights'}; "
                                  "name it with --generator KEY")
        roles["gen"] = biased[0]
    taken.add(roles["gen"])
    embeds = [k for k in tables if k not in taken]
    for role, hint, other in (("src", SRC_HINT, TGT_HINT), ("tgt", TGT_HINT, SRC_HINT)):
        if role not in roles:
            named = [k for k in embeds if hint.search(k) and not other.search(k) and k not in roles.values()]
            if len(named) == 1:
                roles[role] = named[0]
    left = [k for k in embeds if k not in roles.values()]
    if "src" not in roles and "tgt" not in roles and len(left) == 1:
        roles["src"] = roles["tgt"] = left[0]  # one table for both sides
    elif ("src" in roles) != ("tgt" in roles) and len(left) == 1:
        roles["tgt" if "src" in roles else "src"] = left[0]
    if "src" not in roles or "tgt" not in roles:
        raise CheckpointError(f"{source}: cannot tell the source and target embedding tables among "
                              f"{describe(state, embeds) or 'no (vocab, d_model) weights'}; name them with "
                              "--src-embedding KEY --tgt-embedding KEY")
    return roles


def load_torch_nn(path: Path, hparams: dict[str, Any],
                  state: dict[str, torch.Tensor] | None = None) -> tuple[Seq2SeqTransformer, dict[str, Any]]:
    source = str(path)
    opts: dict[str, Any] = {k: default if hparams.get(k) is None else hparams[k] for k, default in OPTIONS.items()}
    hparams = {k: v for k, v in hparams.items() if k not in OPTIONS}
    theirs = seeds.read_state_dict(path) if state is None else state
    prefixes = stacks(theirs, source)
    ours: dict[str, torch.Tensor] = {}
    placed: set[str] = set()
    for side, prefix in prefixes.items():
        map_stack(theirs, side, prefix, ours, placed)
    finals = [s for s in ("encoder", "decoder") if f"{s}_norm.weight" in ours]
    d = ours["encoder_layers.0.self_attn.out_proj.weight"].shape[0]
    rest = [k for k in theirs if k not in placed]
    roles = find_roles(theirs, rest, d, opts, source)
    leftover = [k for k in rest if k not in roles.values() and k not in roles.get("pos", [])
                and not (k.endswith("bias") and k[: -len("bias")] + "weight" == roles["gen"])]
    problems: list[str] = []
    if leftover:
        more = " ..." if len(leftover) > 8 else ""
        problems.append(f"keys that are not part of an nn.Transformer model: {leftover[:8]}{more}")
    if len(finals) == 1:
        problems.append(f"only the {finals[0]} stack has a final LayerNorm; xform applies one to both stacks or "
                        "neither")
    if opts["activation"] not in ("relu", "gelu"):
        problems.append(f"--activation {opts['activation']!r}: nn.Transformer takes relu or gelu")
    ours["src_embed.weight"] = theirs[roles["src"]]
    if roles["tgt"] != roles["src"]:
        ours["tgt_embed.weight"] = theirs[roles["tgt"]]
    ours["lm_head.weight"] = theirs[roles["gen"]]
    gen_bias = roles["gen"][: -len("weight")] + "bias"
    if gen_bias in theirs:
        ours["output_bias"] = theirs[gen_bias]
    found = seeds.read_sizes(ours, hparams, source, ARCH, problems)
    tables = None
    if "pos" in roles:
        tables = [seeds.position_table(theirs[k], k, d, source) for k in roles["pos"]]
        tables = tables * 2 if len(tables) == 1 else tables  # one table for both sides
    fixed = dict(norm_position="pre" if opts["norm_first"] else "post", final_norm=len(finals) == 2,
                 activation=opts["activation"], layer_norm_eps=float(opts["layer_norm_eps"]),
                 scale_embedding=bool(opts["scale_embedding"]), share_embeddings=roles["tgt"] == roles["src"],
                 tie_output=False, positions="learned")
    cfg = seeds.build_config(fixed, found, hparams, problems, tables[0].shape[0] if tables else None, 5000, 1,
                             source, ARCH)
    if tables is None:
        tables = [sinusoid_table(cfg.max_len, cfg.d_model, split=False)] * 2
    model = seeds.assemble(ours, cfg, tables, source)
    found_roles = {"src_embedding": roles["src"], "tgt_embedding": roles["tgt"], "generator": roles["gen"],
                   "positions": roles.get("pos", ["sinusoidal (computed)"])}
    assumed = {k: opts[k] for k in ("norm_first", "activation", "layer_norm_eps", "scale_embedding")}
    note = "batch_first does not change the weights; the bundle takes (batch, length) ids either way"
    return model, seeds.source_record(path, ARCH, hparams, roles=found_roles, options=assumed, note=note)
