//! hostwire-playerthree: PlayerThree protocol 1, sans-IO.
