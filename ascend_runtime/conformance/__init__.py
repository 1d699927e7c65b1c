"""The simulator and the proxy held to the recorded wire of vLLM 0.23.0's OpenAI server.

``corpus`` lists the requests, ``drive`` sends them to a server and keeps each answer's shape
(``shapes``: status, selected headers, JSON key paths and types, SSE framing, error shape, metric
families), ``compare`` lists the differences between a recording and another server's answers, and
``record`` is the command that writes the fixtures from a real engine
(``python -m ascend_runtime.conformance.record``, docs/simulator.md "Recorded conformance").
"""
