//! hostwire-ggui: the ggui live channel, sans-IO.
