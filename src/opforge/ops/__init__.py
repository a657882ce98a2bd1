"""The public tensor API. Importing a family registers its ops."""

from opforge.ops import attention  # noqa: F401
from opforge.ops import attention_decode  # noqa: F401
from opforge.ops import bloom  # noqa: F401
from opforge.ops import compact  # noqa: F401
from opforge.ops import cross_entropy  # noqa: F401
from opforge.ops import elementwise  # noqa: F401
from opforge.ops import embedding  # noqa: F401
from opforge.ops import fused  # noqa: F401
from opforge.ops import fused_linear_cross_entropy  # noqa: F401
from opforge.ops import grouped_matmul  # noqa: F401
from opforge.ops import hashing  # noqa: F401
from opforge.ops import matmul  # noqa: F401
from opforge.ops import moe  # noqa: F401
from opforge.ops import nexmark  # noqa: F401
from opforge.ops import norm  # noqa: F401
from opforge.ops import quant  # noqa: F401
from opforge.ops import reduce  # noqa: F401
from opforge.ops import residual_norm  # noqa: F401
from opforge.ops import rope  # noqa: F401
from opforge.ops import scaled_matmul  # noqa: F401
from opforge.ops import scan  # noqa: F401
from opforge.ops import softmax  # noqa: F401
from opforge.ops import topk  # noqa: F401
from opforge.ops import transpose  # noqa: F401

