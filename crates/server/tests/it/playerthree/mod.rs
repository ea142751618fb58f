mod durable;
mod hostile;
mod mcp;
mod mcp_attack;
mod restart;
mod ws;
