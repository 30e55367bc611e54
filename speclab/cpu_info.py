"""What CPU this is, in the words a benchmark's figure needs: its name, family / model and vector
instructions (speclab.timing.machine_info, the training manifests, the native build's key). A leaf
module: it imports nothing of speclab's, so any module may use it."""

from __future__ import annotations

import platform


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name with what decides a CPU kernel's speed here, its family / model and widest
    vector instructions: 'AMD EPYC (family 25 model 17; AVX-512, AVX512-BF16)' is a Zen 4,
    'AMD EPYC (family 25 model 1; AVX2)' a Zen 3, which a virtual machine's model name alone does not tell."""
    fields = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    isa = [name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX"))
           if flag in flags] or [name for flag, name in (("avx2", "AVX2"),) if flag in flags]
    name = fields.get("model name") or platform.processor() or platform.machine()
    about = [f"family {fields['cpu family']} model {fields['model']}"] if "cpu family" in fields and "model" in fields else []
    parts = about + ([", ".join(isa)] if isa else [])
    return f"{name} ({'; '.join(parts)})" if parts else name
