"""State shared by gateway replicas (config ``state.backend: redis``).

:mod:`.learning` merges the adaptive estimates of every replica, :mod:`.quarantine` mirrors
quarantined fingerprints, :mod:`.sync` runs the background loop that talks to Redis (the
only module that does), and :mod:`.lifespan` wires them into an app's runtime. Requests never
touch Redis: routing reads the local copies, which the loop refreshes.
"""
