"""Device discovery parsing (library/llama_device_info.py)."""

import llama_device_info


def test_nvidia_smi_rows_in_index_order():
    text = "1, NVIDIA GeForce RTX 3060, 12288\n0, NVIDIA GeForce RTX 3090, 24576\n\n"
    assert llama_device_info.parse_nvidia_smi(text) == [("NVIDIA GeForce RTX 3090", 24576),
                                                        ("NVIDIA GeForce RTX 3060", 12288)]


def test_nvidia_smi_name_with_comma():
    assert llama_device_info.parse_nvidia_smi("0, Tesla V100-SXM2-16GB, rev, 16160.0\n") == [
        ("Tesla V100-SXM2-16GB, rev", 16160)]
