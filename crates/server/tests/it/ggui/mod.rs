mod body_budget;
mod durable;
mod expiry;
mod hostile;
mod restart;
mod tenancy;
mod validation_cost;
mod ws;
