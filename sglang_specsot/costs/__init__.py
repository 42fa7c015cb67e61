"""What a forward costs on this machine by rows: the start-up probe (`probe.py`, torch), the
cost model it feeds (`cost_model.py`, plain Python), and the scheduler's published curve that
/server_info reports (`published.py`); beside them, the CPU dtype's timed choice
(`dtype_choice.py`) and the weight and free-memory sizes choices that must fit read (`memory.py`).

Below both the SPECSOT worker (speculative/) and the serving layer (serving/), so that any
server, whatever its speculative algorithm, can measure its row-cost curve; the CPU's int8
kernel choice (cpu/draft_int8.py) times its candidates with the same sweeps. It imports no
other package of sglang-specsot, and importing this package imports nothing.
"""
