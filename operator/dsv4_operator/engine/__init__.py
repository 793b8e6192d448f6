"""Pure engine knowledge: profiles, planner, flags and the rule catalogue."""
