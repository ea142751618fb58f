mod attack;
mod durable;
mod edges;
mod http;
mod logs;
mod python;
mod restart;
mod ws;
