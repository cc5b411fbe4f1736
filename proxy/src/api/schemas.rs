//! Strings with a pattern, each written once for the OpenAPI document. utoipa's `pattern =`
//! attribute takes only a literal, so a pattern used in several places is a schema type, inlined
//! where it is used (never a component of its own, so the document reads as if written inline).

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;

use fencing::MAX_RESOURCE_LEN;

/// Declares a unit type whose schema is a string with `pattern` (and length bounds, if given).
macro_rules! string_schema {
    ($(#[$doc:meta])* $name:ident, $pattern:expr $(, min $min:expr)? $(, max $max:expr)?) => {
        $(#[$doc])*
        pub(super) struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    $(.min_length(Some($min)))?
                    $(.max_length(Some($max)))?
                    .pattern(Some($pattern))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

string_schema!(
    /// A resource name: 1-200 bytes of letters, digits and `._:-`, starting with a letter or
    /// digit, without `..`.
    ResourceName,
    r"^[A-Za-z0-9](\.?[A-Za-z0-9_:-])*\.?$",
    min 1,
    max MAX_RESOURCE_LEN
);

string_schema!(
    /// A `?prefix=` of resource names (`GET /v1/leases`, `GET /v1/watch`): empty, or how a
    /// resource name can begin.
    ResourcePrefix,
    r"^([A-Za-z0-9](\.?[A-Za-z0-9_:-])*\.?)?$",
    max MAX_RESOURCE_LEN
);

string_schema!(
    /// A session id: a positive decimal number that fits in 63 bits.
    SessionId,
    r"^([1-9][0-9]{0,17}|[1-8][0-9]{18}|9[0-1][0-9]{17}|92[0-1][0-9]{16}|922[0-2][0-9]{15}|9223[0-2][0-9]{14}|92233[0-6][0-9]{13}|922337[0-1][0-9]{12}|92233720[0-2][0-9]{10}|922337203[0-5][0-9]{9}|9223372036[0-7][0-9]{8}|92233720368[0-4][0-9]{7}|922337203685[0-3][0-9]{6}|9223372036854[0-6][0-9]{5}|92233720368547[0-6][0-9]{4}|922337203685477[0-4][0-9]{3}|9223372036854775[0-7][0-9]{2}|922337203685477580[0-6]|9223372036854775807)$"
);

string_schema!(
    /// A revision: a decimal number from 0 that fits in 63 bits, written without leading zeros.
    Revision,
    r"^(0|[1-9][0-9]{0,17}|[1-8][0-9]{18}|9[0-1][0-9]{17}|92[0-1][0-9]{16}|922[0-2][0-9]{15}|9223[0-2][0-9]{14}|92233[0-6][0-9]{13}|922337[0-1][0-9]{12}|92233720[0-2][0-9]{10}|922337203[0-5][0-9]{9}|9223372036[0-7][0-9]{8}|92233720368[0-4][0-9]{7}|922337203685[0-3][0-9]{6}|9223372036854[0-6][0-9]{5}|92233720368547[0-6][0-9]{4}|922337203685477[0-4][0-9]{3}|9223372036854775[0-7][0-9]{2}|922337203685477580[0-6]|9223372036854775807)$"
);

string_schema!(
    /// An event id of `GET /v1/watch` (`R` or `R.n`): the messages' `id`, `?last_event_id=` and
    /// `Last-Event-ID` are all one.
    EventId,
    r"^[1-9][0-9]{0,17}(\.[0-9]{1,9})?$"
);
