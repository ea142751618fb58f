mod expiry;
mod game;
mod hostile;
mod play;
mod restart;
mod rpc;
mod services;
mod services_fair;
