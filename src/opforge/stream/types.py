"""PyFlink's ``Types`` for the keyword arguments a PyFlink job passes
(``from_collection(..., type_info=)``, ``map(..., output_type=)``,
``key_by(..., key_type=)``, ...). The engine infers column types from the
records, so a type is used to *check* and *shape* records: an operator's
outputs (and a source's records) are conformed to it as they leave, so a
wrong type fails at the operator that made it, naming it, and
``Types.ROW_NAMED`` gives a positional ``Row`` or tuple its field names.
"""

from __future__ import annotations

from collections.abc import Mapping

from opforge.stream.records import Batch, Row


class TypeInformation:
    def conform(self, value, where: str):
        """``value`` as this type, or a ``TypeError`` naming ``where``."""
        raise NotImplementedError

    def _mismatch(self, value, where: str):
        return TypeError(f"{where}: {value!r} is not of the declared type {self!r}")


class BasicType(TypeInformation):
    def __init__(self, name: str, accepts: tuple, convert=None):
        self.name, self.accepts, self.convert = name, accepts, convert

    def conform(self, value, where):
        if value is None:  # Flink's basic types are nullable
            return value
        if (type(value) is bool and bool not in self.accepts) or not isinstance(value, self.accepts):
            raise self._mismatch(value, where)
        return self.convert(value) if self.convert is not None else value

    def __repr__(self):
        return f"Types.{self.name}()"


class PickledType(TypeInformation):
    """Any Python value (PyFlink's ``PICKLED_BYTE_ARRAY``)."""

    def conform(self, value, where):
        return value

    def __repr__(self):
        return "Types.PICKLED_BYTE_ARRAY()"


class RowType(TypeInformation):
    """``ROW`` / ``ROW_NAMED``: records become ``Row``s (named when the type
    names its fields); a tuple, list, ``Row`` or (named) dict is accepted."""

    def __init__(self, field_types: list, names: list | None = None):
        self.field_types = [_type(t, "Types.ROW") for t in field_types]
        if names is not None and len(names) != len(self.field_types):
            raise ValueError(f"Types.ROW_NAMED: {len(names)} names for {len(self.field_types)} field types")
        self.names = None if names is None else tuple(names)

    def _values(self, value, where):
        if isinstance(value, Mapping) and self.names is not None:
            if set(value) != set(self.names):
                raise self._mismatch(value, where)
            return [value[n] for n in self.names]
        if isinstance(value, Row) and value._names is not None and self.names is not None \
                and value._names != self.names:
            raise self._mismatch(value, where)
        if not isinstance(value, (tuple, list)) or len(value) != len(self.field_types):
            raise self._mismatch(value, where)
        return list(value)

    def conform(self, value, where):
        vals = [t.conform(v, where) for t, v in zip(self.field_types, self._values(value, where))]
        return Row(**dict(zip(self.names, vals))) if self.names is not None else Row(*vals)

    def __repr__(self):
        if self.names is None:
            return f"Types.ROW({self.field_types!r})"
        return f"Types.ROW_NAMED({list(self.names)!r}, {self.field_types!r})"


class TupleType(RowType):
    def __init__(self, field_types: list):
        super().__init__(field_types)

    def conform(self, value, where):
        if isinstance(value, Mapping):
            raise self._mismatch(value, where)
        return tuple(t.conform(v, where) for t, v in zip(self.field_types, self._values(value, where)))

    def __repr__(self):
        return f"Types.TUPLE({self.field_types!r})"


class ListType(TypeInformation):
    def __init__(self, element_type):
        self.element = _type(element_type, "Types.LIST")

    def conform(self, value, where):
        if not isinstance(value, (list, tuple)):
            raise self._mismatch(value, where)
        return [self.element.conform(v, where) for v in value]

    def __repr__(self):
        return f"Types.LIST({self.element!r})"


class MapType(TypeInformation):
    def __init__(self, key_type, value_type):
        self.key, self.value = _type(key_type, "Types.MAP"), _type(value_type, "Types.MAP")

    def conform(self, value, where):
        if not isinstance(value, Mapping):
            raise self._mismatch(value, where)
        return {self.key.conform(k, where): self.value.conform(v, where) for k, v in value.items()}

    def __repr__(self):
        return f"Types.MAP({self.key!r}, {self.value!r})"


def _type(t, where: str) -> TypeInformation:
    if not isinstance(t, TypeInformation):
        raise TypeError(f"{where}: expected a type from opforge.stream.Types (e.g. Types.INT()), got {t!r}")
    return t


def _basic(name: str, accepts: tuple, convert=None):
    """``Types.NAME()`` for a basic type."""
    return staticmethod(lambda: BasicType(name, accepts, convert))


class Types:
    """PyFlink's ``pyflink.common.Types`` (the ones a DataStream job uses)."""

    INT = _basic("INT", (int,), int)
    LONG = _basic("LONG", (int,), int)
    SHORT = _basic("SHORT", (int,), int)
    BYTE = _basic("BYTE", (int,), int)
    FLOAT = _basic("FLOAT", (int, float), float)
    DOUBLE = _basic("DOUBLE", (int, float), float)
    STRING = _basic("STRING", (str,))
    BOOLEAN = _basic("BOOLEAN", (bool,))

    @staticmethod
    def PICKLED_BYTE_ARRAY():
        return PickledType()

    @staticmethod
    def ROW(field_types: list):
        return RowType(field_types)

    @staticmethod
    def ROW_NAMED(field_names: list, field_types: list):
        return RowType(field_types, field_names)

    @staticmethod
    def TUPLE(field_types: list):
        return TupleType(field_types)

    @staticmethod
    def LIST(element_type):
        return ListType(element_type)

    BASIC_ARRAY = LIST

    @staticmethod
    def MAP(key_type, value_type):
        return MapType(key_type, value_type)


def checked_type(t, where: str) -> TypeInformation | None:
    """A keyword argument's type: None, or a ``Types`` value (else a TypeError)."""
    return None if t is None else _type(t, where)


def conform_batch(batch: Batch, type_info: TypeInformation, where: str) -> Batch:
    """The batch's records conformed to ``type_info`` (timestamps and record watermarks kept)."""
    if len(batch) == 0:
        return batch
    records = [type_info.conform(r, where) for r in batch.records()]
    out = Batch.from_records(records, batch.device, timestamps=batch.timestamps, where=where)
    return out.marked_like(batch)
