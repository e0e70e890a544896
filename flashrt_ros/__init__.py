"""flashrt_ros: ROS 2 lifecycle node and tools that run flashrt_core policies on camera topics.

The ROS package ``flashrt_ros`` also generates its message classes (``flashrt_ros.msg``) into a Python package of
the same name; the two halves may live in different directories (source checkout vs. the install prefix), so this
package extends its ``__path__`` over every ``flashrt_ros`` directory on ``sys.path``.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
