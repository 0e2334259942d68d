"""The warp-specialised experts kernel's constants as its source states them
(src/cuda/sm90a/experts_ws.cu), for the host models ws_protocol.py and ws_layout.py: they read
the kernel's own numbers, so a change there is what they check."""
import os, re

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../src/cuda/sm90a/experts_ws.cu')

def ws_constant(name):
    # a `constexpr int NAME = N;` of the kernel's source
    return int(re.search(r'constexpr int ' + name + r' = (\d+);', open(_SRC).read()).group(1))
