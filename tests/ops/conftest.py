"""``tests/ops/interpret/`` runs under ``TRITON_INTERPRET=1`` only, in a process of
its own (``test_triton_interpreter.py``): it is collected there, not here."""
import os

collect_ignore = [] if os.environ.get('TRITON_INTERPRET') == '1' else ['interpret']
