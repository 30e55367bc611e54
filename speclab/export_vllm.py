"""Checkpoints trained here, in the formats real vLLM loads (the way out of a laptop).

    python -m speclab.export_vllm path smollm2          # a directory both engines accept, for a short name
    python -m speclab.export_vllm path smollm2-draft    # the distilled draft, exported for vLLM (once)
    python -m speclab.export_vllm eagle --approximate --out DIR   # see EAGLE below: loads, but is not the same head

vLLM picks its model class from config.json's `architectures` and reads Hugging Face weight names:
  draft_model  any Llama directory (config.json with "architectures": ["LlamaForCausalLM"], safetensors,
               tokenizer). speclab's drafts are exactly that: `export_draft` completes the shipped
               SmolLM2 draft (layers + the target's embeddings) and names its architecture. Exact.
  eagle        vLLM's `EagleLlamaForCausalLM` (vllm/model_executor/models/llama_eagle.py): fc(2d -> d) on
               [embedding; feature], decoder layers whose first has NO input RMSNorm, no final norm (the
               target's LM head reads the head's output as it is), features = the target's output AFTER its
               final norm, the full vocabulary. speclab's head (speclab/models/heads/eagle.py) normalizes the
               layer input, reads the feature BEFORE the final norm, applies the target's final norm before
               the LM head, and drafts over an 8192-token sub-vocabulary (d2t). The per-token RMS of the
               feature cannot be undone by any weight, so no export is exact: `export_eagle` refuses unless
               asked for an approximation, which loads and drafts in vLLM (a measured, low acceptance).
  eagle3       vLLM's `Eagle3LlamaForCausalLM` (llama_eagle3.py) normalizes the embedding and the feature
               separately and attends over their concatenation (qkv: 2d -> ...), its residual stream being
               the feature alone; speclab's EAGLE-3-style head mixes them with one fc before a standard
               layer. Not convertible either; a head vLLM can run must be trained in vLLM's layout.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

ARCH = ["LlamaForCausalLM"]
EAGLE_ARCH = ["EagleLlamaForCausalLM"]


def vllm_dir(name) -> Path:
    """A checkpoint directory real vLLM loads for a speclab short name ("target", "draft", "smollm2",
    "smollm2-draft") or a directory; exporting (once) where speclab's own directory lacks what vLLM needs."""
    from speclab.models.hub import REAL_DRAFT, resolve

    if name in REAL_DRAFT:
        return export_draft()
    where, local = resolve(name, "target")
    if not local:
        raise ValueError(f"{name!r} is a hub id: vLLM takes it as it is (nothing to export)")
    path = Path(where)
    config = json.loads((path / "config.json").read_text())
    if not config.get("architectures"):
        raise ValueError(f"{path}/config.json names no architecture, so vLLM would guess one: export it with "
                         f"`python -m speclab.export_vllm draft --source {path} --out DIR`")
    return path


def export_draft(source=None, out=None) -> Path:
    """The distilled SmolLM2 draft (or any speclab Llama directory `source`) as a vLLM draft_model
    checkpoint: the same files with `architectures` named. Default `out`: speclab's cache, once per
    shipped draft."""
    from speclab.models import smollm2, smollm2_draft

    src = Path(source) if source is not None else smollm2_draft.draft_dir()
    if out is None:
        out = smollm2.cache_root() / "vllm" / src.name
    out = Path(out)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file() and \
            json.loads((out / "config.json").read_text()).get("architectures") == ARCH and out.stat().st_mtime >= \
            (src / "model.safetensors").stat().st_mtime:
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    config = json.loads((tmp / "config.json").read_text())
    config["architectures"] = ARCH
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def export_eagle(head_name="eagle-smollm2", target="smollm2", out=None, *, approximate: bool = False) -> Path:
    """speclab's EAGLE head in vLLM's `eagle` layout. Only `approximate=True` (see the module docstring):
    the layer's input norm, the final norm and the sub-vocabulary are dropped, and vLLM feeds post-norm
    features the head was not trained on."""
    if not approximate:
        raise ValueError("speclab's EAGLE head cannot be exported exactly to vLLM's EagleLlamaForCausalLM (its "
                         "layer-input RMSNorm, pre-norm features and final norm have no counterpart there; see "
                         "speclab/export_vllm.py): pass approximate=True (--approximate) to get a head that loads "
                         "and drafts in vLLM at a lower acceptance, or train a head in vLLM's layout")
    from safetensors.torch import load_file, save_file

    from speclab.models.heads import head_directory
    from speclab.models.hub import resolve

    src = head_directory(head_name)
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("method") != "eagle" or len(cfg.get("hidden_layers", [])) != 1:
        raise ValueError(f"{src}: only a single-feature 'eagle' head maps onto vLLM's eagle layout "
                         f"(got method {cfg.get('method')!r}, layers {cfg.get('hidden_layers')})")
    tdir = Path(resolve(target, "target")[0])
    tconfig = json.loads((tdir / "config.json").read_text())
    weights = load_file(str(src / "model.safetensors"))
    state = {"fc.weight": weights["fc.weight"]}
    for k, v in weights.items():
        if k.startswith("layer.") and "input_layernorm" not in k:
            state["layers.0." + k.removeprefix("layer.")] = v
    lay = cfg["layer"]
    config = {**{k: tconfig[k] for k in ("vocab_size", "bos_token_id", "eos_token_id", "max_position_embeddings",
                                         "hidden_act", "tie_word_embeddings") if k in tconfig},
              "architectures": EAGLE_ARCH, "model_type": "llama", "num_hidden_layers": 1,
              "hidden_size": lay["hidden_size"], "intermediate_size": lay["intermediate_size"],
              "num_attention_heads": lay["num_attention_heads"], "num_key_value_heads": lay["num_key_value_heads"],
              "head_dim": lay["head_dim"], "rms_norm_eps": lay["rms_norm_eps"], "rope_theta": lay["rope_theta"],
              "dtype": "float32",
              "speclab_export": {"from": str(src), "approximate": True,
                                 "dropped": ["layer.input_layernorm", "target final norm before the LM head",
                                             f"draft vocabulary d2t ({cfg.get('draft_vocab_size')} tokens)"]}}
    out = Path(out) if out is not None else Path(src.name + "-vllm-approx")
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.float32).contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("path", help="print a directory vLLM loads for a short name (exporting once if needed)")
    p.add_argument("name")
    d = sub.add_parser("draft", help="export a draft directory for vLLM's draft_model")
    d.add_argument("--source", default=None, help="a speclab Llama directory (default: the SmolLM2 draft)")
    d.add_argument("--out", default=None)
    e = sub.add_parser("eagle", help="export speclab's EAGLE head in vLLM's eagle layout (approximate only)")
    e.add_argument("--head", default="eagle-smollm2")
    e.add_argument("--target", default="smollm2")
    e.add_argument("--out", default=None)
    e.add_argument("--approximate", action="store_true", help="accept the approximation the docstring describes")
    args = ap.parse_args(argv)
    if args.cmd == "path":
        print(vllm_dir(args.name))
    elif args.cmd == "draft":
        print(export_draft(args.source, args.out))
    else:
        try:
            print(export_eagle(args.head, args.target, args.out, approximate=args.approximate))
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
