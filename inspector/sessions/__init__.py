"""Writer sessions: the writer's lease on its worker name (``lease``), whether a writer is alive
(``liveness``), which sessions begin a new training (``trainings``), and what each manifest says
its session wrote against what is there (``crosscheck``).
"""
