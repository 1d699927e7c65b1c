"""Deployment kit for DeepSeek-V3/R1 on Huawei Ascend NPUs (vLLM-Ascend, PD separation, large EP)."""

__version__ = "0.1.0"
