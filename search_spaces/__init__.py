"""The search spaces and study files cubic ships (YAML; see ``cubic.shipped``).

A package only so that a built wheel carries them beside ``cubic``; there is no code here.
"""
