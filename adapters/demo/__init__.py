"""A small, real RL run on CPU through both backend paths: what ``cliptrack demo`` trains."""
