"""Tools that measure and check the kernels in `hypernet_attention.ops`; ops/ never imports
them (issue 54): the hardware rules a lowered Mosaic GPU kernel must meet (`hopper_rules`)."""
