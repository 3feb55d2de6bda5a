"""The hardware part of the version matrix: records must tell a Zen 4 host from a Zen 5 one."""

from __future__ import annotations

from crucible.core.versions import core_name, cpu_info, describe_cpu

# Trimmed /proc/cpuinfo of the two AVX-512 hosts this project has run on: both call themselves
# "AMD EPYC" and report AVX-512 and VNNI; only family / model tell them apart.
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni avx512vbmi gfni avx512_vbmi2
"""
ZEN5 = ZEN4.replace("cpu family\t: 25", "cpu family\t: 26").replace("model\t\t: 17", "model\t\t: 2")
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp sve
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_zen_generations_from_family_and_model() -> None:
    zen4, zen5 = cpu_info(ZEN4), cpu_info(ZEN5)
    assert (zen4["family"], zen4["model_number"], zen4["stepping"], zen4["core"]) == (25, 17, 1, "zen4")
    assert (zen5["family"], zen5["model_number"], zen5["core"]) == (26, 2, "zen5")
    # The flags that pick kernel paths are kept, in a fixed order; others (sse2, avx512_vbmi2) are not.
    assert zen4["simd_flags"] == ["avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni",
                                  "avx512vbmi", "gfni"]
    assert core_name("AuthenticAMD", 25, 0x01) == "zen3"
    assert core_name("AuthenticAMD", 25, 0x21) == "zen3"
    assert core_name("AuthenticAMD", 25, 0x61) == "zen4"
    assert core_name("GenuineIntel", 6, 143) is None
    assert "zen4, family 25 model 17" in describe_cpu(zen4)


def test_aarch64_features_and_missing_fields() -> None:
    arm = cpu_info(ARM)
    assert arm["simd_flags"] == ["asimd", "asimddp", "sve"]
    assert arm["family"] is None and arm["core"] is None and arm["vendor"] is None
    assert "family" not in describe_cpu(arm)
    empty = cpu_info("")
    assert empty["simd_flags"] == [] and empty["model"]
    odd = cpu_info("vendor_id\t: AuthenticAMD\ncpu family\t: 0x19\nmodel\t\t: 08\nstepping\t: unknown\n")
    assert (odd["family"], odd["model_number"], odd["stepping"], odd["core"]) == (25, 8, None, "zen3")
