"""Pulumi program: PD-separated DeepSeek-V3/R1 on vLLM-Ascend for the selected stack."""

from ascend_runtime.deploy.program import main

main()
