"""Algorithm registry: name -> class. Each module implements one algorithm of one paper."""
from __future__ import annotations

from fedbench.algorithms.acd_pfl import ACDPFL
from fedbench.algorithms.ascd_pfl import ASCDPFL
from fedbench.algorithms.asvrcd_pfl import ASVRCDPFL
from fedbench.algorithms.base import Algorithm, Round
from fedbench.algorithms.c_fedda import CFedDA
from fedbench.algorithms.centralized import Centralized
from fedbench.algorithms.codasca import CODASCA
from fedbench.algorithms.ditto import Ditto
from fedbench.algorithms.fast_fedda import FastFedDA
from fedbench.algorithms.fedavg import FedAvg
from fedbench.algorithms.fedda import FedDA
from fedbench.algorithms.fedmid import FedMiD
from fedbench.algorithms.fedprox import FedProx
from fedbench.algorithms.fedxl1 import FeDXL1
from fedbench.algorithms.fedxl2 import FeDXL2
from fedbench.algorithms.l2sgd_plus import L2SGDPlus
from fedbench.algorithms.local_pair import LocalPair
from fedbench.algorithms.local_sgd_ce import LocalSGDCE
from fedbench.algorithms.lsgd_pfl import LSGDPFL
from fedbench.algorithms.mc_fedda import MCFedDA
from fedbench.algorithms.per_fedavg import PerFedAvg
from fedbench.algorithms.pfedfbe import PFedFBE
from fedbench.algorithms.pfedme import PFedMe
from fedbench.algorithms.scaffold import SCAFFOLD
from fedbench.algorithms.scd_pfl import SCDPFL
from fedbench.algorithms.svrcd_pfl import SVRCDPFL

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (FedAvg, FedMiD, FedDA, Ditto, FastFedDA, CFedDA, MCFedDA, FeDXL1, FeDXL2,
                                              LocalPair, LocalSGDCE, Centralized, CODASCA, PFedFBE, PFedMe, FedProx,
                                              LSGDPFL, ACDPFL, ASCDPFL, ASVRCDPFL, SCDPFL, SVRCDPFL, L2SGDPlus,
                                              PerFedAvg, SCAFFOLD)}
"""Every registered algorithm class by name: the built-in ones, and the plugins registered in this process
(`fedbench.plugins`)."""

__all__ = ["ALGORITHMS", "Algorithm", "Round"]
