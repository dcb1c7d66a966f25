import PylonCore

/// An MA-level failure. MA endpoints answer it with HTTP 200 and the body
/// `{"code": code, "message": message}`; HTTP statuses are kept for requests that are not
/// acceptable as HTTP or JSON at all (see `APIError`).
struct MAError: Error, Equatable {
    /// Stable MA result codes; the one table of them (documented in docs/backend-openapi.yaml
    /// as `MACode`). Negative codes and 3003/3013 are the SDK's (ma.md, "Error codes used");
    /// 31xx and 40xx are the backend's own. None is ever 0.
    struct Code: RawRepresentable, Equatable, Sendable {
        let rawValue: Int
        init(rawValue: Int) { self.rawValue = rawValue }

        /// Success; only ever a result, never an `MAError`.
        static let ok = Code(rawValue: 0)

        // Call-level codes (`code` of the reply).
        /// The `euid` names no user of this AppKey.
        static let unknownEUID = Code(rawValue: -1)
        /// A required field is missing or of the wrong JSON type, an unknown `op`, or
        /// (identify) no identifier is valid.
        static let invalidParameter = Code(rawValue: -3)
        /// `POST /v1/admin/ma/{appKey}` set `disabled: true`.
        static let disabled = Code(rawValue: -4)
        /// The request names a `project` other than the AppKey's current one.
        static let projectSwitched = Code(rawValue: -6)

        // Per-field identifier codes (`fields` of identify).
        static let identifierTooLong = Code(rawValue: 3003)
        static let identifierInvalid = Code(rawValue: 3013)
        /// Another user already holds this email, phone or anonymous_id; it was not attached.
        static let identifierTaken = Code(rawValue: 3101)
        /// The resolved user already has a different anonymous_id; the new one was not attached.
        static let identifierConflict = Code(rawValue: 3102)

        // User-property codes (`code` of a properties reply). Nothing is changed.
        /// updateObjectArray: no element has that identifier.
        static let noMatchingElement = Code(rawValue: 4001)
        /// updateObjectArray, removeObjectArray: several elements have that identifier.
        static let severalMatchingElements = Code(rawValue: 4002)
        /// identifierKey is not the metadata's, or identifierValue is not of its identifierType.
        static let identifierMismatch = Code(rawValue: 4003)
        /// updateObjectArray: a subfield of `values` is not in the metadata, has another type,
        /// or is the identifierKey.
        static let subfieldMismatch = Code(rawValue: 4004)
        /// A value of a type or shape the operation does not take (docs/MA.md, "User properties").
        static let invalidValue = Code(rawValue: 4005)
        /// A property name breaks the naming rule (docs/MA.md, "User properties").
        static let invalidPropertyName = Code(rawValue: 4006)
        /// More than `Limits.maxPropertiesPerCall` properties in one call.
        static let tooManyProperties = Code(rawValue: 4007)
    }

    var code: Code
    var message: String

    init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    var body: JSON { ["code": .int(Int64(code.rawValue)), "message": .string(message)] }

    static func invalid(_ message: String) -> MAError { MAError(.invalidParameter, message) }
    static let unknownUser = MAError(.unknownEUID, "unknown euid")
    static let maDisabled = MAError(.disabled, "MA is disabled for this project")
    static let switched = MAError(.projectSwitched, "project switched")
}
