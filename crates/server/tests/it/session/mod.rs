mod expiry;
mod game;
mod hostile;
mod restart;
mod services;
mod services_fair;
