; Context for completions. Capture names: queries/README.md.
; inherits: typescript
; TSX is TypeScript plus JSX; JSX attribute strings are `string` nodes already.
