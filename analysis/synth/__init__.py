"""A fixture, not a stage: synthetic nsys exports with the real schema, for ground truth and scale (build; ray: a Ray-style capture)."""
