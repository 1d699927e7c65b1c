"""The P:D planner: how many prefill and decode instances the forecast load needs (docs/pd-planner.md).

Modules: ``forecast`` (Holt EWMA with trend), ``observe`` (proxy metrics -> per-interval
observations), ``decide`` (the pure decision function), ``daemon`` (the periodic process
and its Prometheus metrics).
"""
