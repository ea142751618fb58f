mod durable;
mod game;
mod props;
mod rules;
mod services;
