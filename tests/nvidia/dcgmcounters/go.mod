module gpushare.local/dcgmcounters

go 1.22
