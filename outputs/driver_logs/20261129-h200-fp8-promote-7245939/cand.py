CAND = {"lab-promote-o2": {"LAB_FWD_FP8_PV_PROMOTE": 1, "LAB_FWD_FP8_WS_OVERLAP": 2},
        "lab-promote-b128": {"LAB_FWD_FP8_PV_PROMOTE": 1, "LAB_FWD_FP8_WS_D128_BC": 128}}
