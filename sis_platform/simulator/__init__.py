"""The feed simulator (`sis-feed`): a deterministic, seeded simulation of the SIS Sportsdata
feed (`generator/`), the model of a master it renders against (`model.py`, `names.py`), the
invalid messages it can make (`corrupt.py`), feed files (`feedfile.py`) and the command
(`cli.py`)."""
