"""How results reach people: rich tables on a terminal, plain lines when piped, JSON, and live progress."""
