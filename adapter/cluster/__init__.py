"""The domain on several node processes: each reads the others' lanes (sibling_lanes.py), hears
their changes to the routing state (shared_routes.py), knows which are alive (membership.py) and
takes over the sessions of one taken for gone (takeover.py); feature.py attaches all of it to
the node's core."""
