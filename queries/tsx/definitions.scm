; Definitions for the workspace index. Capture names: queries/README.md.
; inherits: typescript
