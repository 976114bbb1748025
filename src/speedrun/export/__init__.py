"""``python -m speedrun.export``: finished run dirs -> a parameter-golf submission folder (speedrun.export.cli).

runs.py loads the run dirs and refuses what should not be submitted; folder.py writes the folder's files.
"""
