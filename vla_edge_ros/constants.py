# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Shapes fixed by the design (DESIGN.md §1): one frame is 32 vision tokens, one action is 8 tokens (a chunk decodes
one action, or K of them in one parallel pass, §17); and the design's default numbers, one home for each."""

FRAME_H, FRAME_W, FRAME_C = 64, 128, 3
PATCH = 16
GRID_H, GRID_W = FRAME_H // PATCH, FRAME_W // PATCH  # 4 x 8
VISION_TOKENS = GRID_H * GRID_W  # 32
PATCH_DIM = PATCH * PATCH * FRAME_C  # 768, flattened (row, col, channel) inside a patch
ACTION_TOKENS = 8  # tokens of one action (its 8 dimensions): decode passes per chunk, one transient KV slot each
MAX_ACTION_CHUNK = 8  # actions a parallel chunk may plan (vla_action_chunk K: K x 8 action tokens in one pass)
ACTION_VOCAB = 256  # the last 256 ids of the vocabulary (OpenVLA convention)
MAX_STATE_DIM = 64  # the robot-state vector a model may take (OpenVLA-OFT: 8 on LIBERO, 14 on ALOHA; pi0 pads to 32)
STATE_FIELDS = ("position", "velocity")  # the sensor_msgs/JointState fields a state vector may read

# The design's defaults (DESIGN.md §1): the node's parameters, the tools' options and the core's keyword
# defaults all read them from here.
PERIOD_MS = 33.0  # control cycle = deadline
SAFETY_MARGIN_MS = 2.0  # kept free at the end of every cycle
EMA_ALPHA = 0.2  # weight of a new sample in the admission EMAs
MAX_FRAME_AGE_MS = 200.0  # older frames -> fallback stale_frame
KV_CAPACITY_TOKENS = 4096  # KV slots per layer (GPU)
CPU_KV_CAPACITY_TOKENS = 512  # the NumPy backend's reference attention reads every slot: a smaller cache on a CPU
VRAM_CEILING_GB = 8.0  # modeled edge budget
GROUP_SIZE = 128  # 4-bit weights (W4A16): one scale (and zero point) per this many input channels
DEFAULT_PROMPT_TOKENS = 16  # the system prompt when the model has no tokenizer (engine.system_prompt_ids)
CAMERA_NO_FRAMES_RESTART_S = 5.0  # camera watchdog: a publisher matched, no frame this long -> restart the camera
