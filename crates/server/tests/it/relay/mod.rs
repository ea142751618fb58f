mod attack;
mod durable;
mod edges;
mod http;
mod python;
mod restart;
mod ws;
