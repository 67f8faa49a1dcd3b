"""The host link: a UART, the SLIP/CRC frame protocol (shared with the host), the
link's receiver and transmitter, and the board core (UART + link + core).
"""
